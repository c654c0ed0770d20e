"""ctypes binding to espeak-ng (the ``espeakng-loader`` wheel): synthesis and the phonemes
actually spoken.

Determinism: every call reloads the library (it keeps synthesis state in static
variables) and re-seeds both random generators it draws from, so the output
depends only on the arguments.
"""

from __future__ import annotations

import _ctypes
import ctypes
import os

import numpy as np

_STRESS = str.maketrans("", "", "ˈˌ")
_SYNTH_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_PHONEMES_IPA = 0x02
_RATE, _VOLUME, _PITCH, _RANGE = 1, 2, 3, 4


class Espeak:
    """ctypes binding to the libespeak-ng of the ``espeakng-loader`` wheel.

    One instance per process (espeak-ng has global state): ``Espeak()``
    returns the process's instance. ``synthesize`` and ``phonemize`` reload
    the library and re-seed both generators it draws from (its own, which
    ``espeak_Initialize`` seeds from the clock, and libc's ``rand``) first, so
    their output depends only on their arguments.
    """

    _instance: Espeak | None = None
    _pid = -1

    def __new__(cls) -> Espeak:
        if cls._instance is None or cls._pid != os.getpid():
            inst = super().__new__(cls)
            inst._setup()
            cls._instance, cls._pid = inst, os.getpid()
        return cls._instance

    def _setup(self) -> None:
        import espeakng_loader

        self._lib_path = espeakng_loader.get_library_path()
        self._data_path = espeakng_loader.get_data_path().encode()
        self._lib = None
        self._libc = ctypes.CDLL(None)  # espeak-ng also draws from libc's rand()
        self._chunks: list[np.ndarray] = []
        self._callback = _SYNTH_CB(self._on_audio)  # keep a reference: C holds the pointer
        self.sample_rate = 0
        self.reset()

    def _on_audio(self, wav, n, _events) -> int:
        if wav and n > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        return 0  # 0 = continue synthesis

    def reset(self) -> None:
        """Unload and reload libespeak-ng so that all its static state starts fresh (~0.3 ms)."""
        if self._lib is not None:
            self._lib.espeak_Terminate()
            _ctypes.dlclose(self._lib._handle)
            self._lib = None
        try:  # still mapped? then someone else holds a handle and its static state survives
            probe = ctypes.CDLL(self._lib_path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            probe = None
        if probe is not None:
            _ctypes.dlclose(probe._handle)
            raise RuntimeError(f"{self._lib_path} is loaded elsewhere in this process, so it cannot be "
                               "reset; espeak-ng output would depend on earlier synthesis")
        lib = ctypes.CDLL(self._lib_path)
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_Synth.argtypes = [
            ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
            ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
        ]
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_int, ctypes.c_int]
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, self._data_path, 0)
        if rate <= 0:
            raise RuntimeError(f"espeak_Initialize failed ({rate}) with data at {self._data_path.decode()}")
        lib.espeak_SetSynthCallback(self._callback)
        lib.espeak_ng_SetRandSeed(1)  # Initialize seeds espeak's own generator from time()
        self._libc.srand(1)
        self._lib, self.sample_rate = lib, rate

    def _set_voice(self, voice: str) -> None:
        if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise ValueError(f"espeak-ng has no voice {voice!r}; expected e.g. 'en-us+m3'")

    def synthesize(self, text: str, voice: str, rate: int = 175, pitch: int = 50, pitch_range: int = 50,
                   volume: int = 60) -> np.ndarray:
        """Speak ``text`` with an espeak-ng voice name (``en-us+m3``). Returns int16 samples ``(T,)``
        at ``self.sample_rate`` Hz."""
        self.reset()
        self._set_voice(voice)
        for param, value in ((_RATE, rate), (_PITCH, pitch), (_RANGE, pitch_range), (_VOLUME, volume)):
            self._lib.espeak_SetParameter(param, int(value), 0)
        self._chunks = []
        data = text.encode("utf-8")
        err = self._lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        if err != 0:
            raise RuntimeError(f"espeak_Synth failed with status {err} for {text!r}")
        self._lib.espeak_Synchronize()
        return np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)

    def phonemize(self, text: str, voice: str) -> list[list[str]]:
        """The phonemes espeak-ng speaks for ``text`` with that voice (an espeak-ng voice name):
        one list of units per word."""
        self.reset()
        self._set_voice(voice)
        buf = ctypes.create_string_buffer(text.encode("utf-8"))
        ptr = ctypes.c_char_p(ctypes.addressof(buf))
        mode = _PHONEMES_IPA | (ord("_") << 8)  # IPA, units separated by "_", words by " "
        words: list[list[str]] = []
        while ptr.value:  # one clause per call; espeak advances ptr
            out = self._lib.espeak_TextToPhonemes(ctypes.byref(ptr), _CHARS_UTF8, mode)
            for word in (out or b"").decode("utf-8").split():
                units = [u for raw in word.split("_") for u in normalize_phoneme(raw)]
                if units:
                    words.append(units)
        return words


def normalize_phoneme(unit: str) -> list[str]:
    """Map one espeak IPA unit to corpus units: drop stress, split r-coloured vowels and triphthongs."""
    unit = unit.translate(_STRESS).strip()
    if not unit:
        return []
    if len(unit) > 1 and unit.endswith("ɹ"):  # ɑːɹ, ɔːɹ, ɛɹ, ɪɹ, ʊɹ → vowel + ɹ
        return [unit[:-1], "ɹ"]
    if unit in ("aɪə", "aɪɚ"):
        return ["aɪ", unit[2:]]
    return [unit]
