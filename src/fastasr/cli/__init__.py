"""The commands: each composes its configuration (Hydra or argparse), calls one library
function and prints. Nothing in the library imports this package.

=======================================  ==========================================================
``train.py``, ``evaluate.py``            training and scoring (at the repository's root)
``python -m fastasr.transcribe``         transcribe audio with a checkpoint (:mod:`fastasr.recognition.transcription_job`)
``python -m fastasr.export``             a checkpoint as an ONNX folder (:func:`fastasr.deploy.export.export_recogniser`)
``python -m fastasr.cli.tune``           the beam search's LM weight and word score on dev (:func:`fastasr.recognition.scoring.tune_recogniser`)
``python -m fastasr.cli.redecode``       a finished run's final decoding again (:func:`fastasr.recognition.final_decoding.final_decoding`)
``python -m fastasr.cross_eval``         the train-with-X / decode-with-Y matrix (:func:`fastasr.studies.matrix.run_matrix`)
``python -m fastasr.cli.budget``         the equal-budget study (:func:`fastasr.studies.budget.run_budget`)
``python -m fastasr.cli.report``         a run's or a matrix's HTML page (:func:`fastasr.studies.report.build_report`)
``python -m fastasr.cli.lm``             an n-gram LM from manifests (:func:`fastasr.lm.build.build`)
``python -m fastasr.cli.features``       the feature caches of a training config (:func:`fastasr.data.feature_cache.build_for_config`)
``python -m fastasr.cli.calibrate``      the ``attention=auto`` crossovers of this machine (:mod:`fastasr.attention.calibrate`)
=======================================  ==========================================================

:mod:`fastasr.cli.preflight` holds the Hydra callbacks that refuse a ``train.py`` or
``evaluate.py`` command before its run directory is made. ``train.py``, ``evaluate.py`` and
``python -m fastasr.transcribe`` import the library inside ``main``, after Hydra has composed
(and the preflight checked) the config, so that a refusal does not wait for torch and Lightning
to load.

``python -m fastasr.transcribe``, ``python -m fastasr.cross_eval`` and ``python -m fastasr.export`` are
the names the project's outside contract (docs/ARCHITECTURE.md, "commands") gives
:mod:`fastasr.cli.transcribe`, :mod:`fastasr.cli.matrix` and :mod:`fastasr.cli.export`: five-line
modules run them. The PyTorch-free runtime's command, ``python -m fastasr.onnx.transcribe``, lives
in its package (:mod:`fastasr.onnx.transcribe`), which imports nothing of this one.

The corpus builders (``python -m fastasr.corpora.<corpus>``) are commands of their own top
layer, :mod:`fastasr.corpora`, which nothing of training imports; the kernels' build and
compile checks (``fastasr.kernels.native``, ``fastasr.kernels.compile_check``) are what
``make install`` and ``make gpu-check`` call.
"""
