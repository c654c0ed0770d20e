"""The commands: each composes its configuration (Hydra or argparse), calls the library and
prints. Nothing in the library imports this package. Each module ``fastasr.cli.<name>`` has a
``main()``, is installed as the console script ``fastasr-<name>`` (pyproject.toml
``[project.scripts]``) and runs as ``python -m fastasr.cli.<name>``:

===========================  ==============================================================================
``fastasr-train``            training (:mod:`fastasr.cli.train`; also ``python train.py``)
``fastasr-evaluate``         decode and score a manifest (:mod:`fastasr.cli.evaluate`; also ``python evaluate.py``)
``fastasr-transcribe``       transcribe audio with a checkpoint (:mod:`fastasr.recognition.transcription_job`)
``fastasr-export``           a checkpoint as an ONNX folder (:func:`fastasr.deploy.export.export_recogniser`)
``fastasr-tune``             the beam search's LM weight and word score on dev (:func:`fastasr.recognition.scoring.tune_recogniser`)
``fastasr-redecode``         a finished run's final decoding again (:func:`fastasr.training.fit.decode_run`)
``fastasr-matrix``           the train-with-X / decode-with-Y matrix (:func:`fastasr.studies.matrix.run_matrix`)
``fastasr-budget``           the equal-budget study (:func:`fastasr.studies.budget.run_budget`)
``fastasr-report``           a run's or a matrix's HTML page (:func:`fastasr.studies.report.build_report`)
``fastasr-lm``               an n-gram LM from manifests (:func:`fastasr.lm.build.build`)
``fastasr-features``         the feature caches of a training config (:func:`fastasr.cli.features.build_for_config`)
``fastasr-calibrate``        the ``attention=auto`` crossovers of this machine (:mod:`fastasr.attention.calibrate`)
``fastasr-corpus``           a corpus's manifests: ``synthetic``, ``digits``, ``librispeech``, ... (:mod:`fastasr.corpora`)
``fastasr-kernels``          the C++ kernels' ``build`` and ``check``, the Triton kernels' ``compile-check``
===========================  ==============================================================================

:mod:`fastasr.cli.preflight` holds the Hydra callbacks that refuse a training, evaluation or
transcription command before its run directory is made; those commands import the library
inside ``main``, after Hydra has composed (and the preflight checked) the config, so that a
refusal does not wait for torch and Lightning to load. ``fastasr-corpus`` and ``fastasr-kernels``
are made of subcommands (:mod:`fastasr.cli.subcommands`), each the ``main(argv)`` that defines its
arguments beside what it runs (a corpus builder, :mod:`fastasr.kernels.native`,
:mod:`fastasr.kernels.compile_check`).

Outside this package only three modules are run as commands: ``fastasr.transcribe`` and
``fastasr.cross_eval``, two-line modules kept because the project's outside contract
(DESIGN.md) names ``fastasr-transcribe`` and ``fastasr-matrix``, and the
PyTorch-free runtime's ``fastasr-onnx-transcribe`` (:mod:`fastasr.onnx.transcribe`), which stays
in its package because this one's commands import torch and the runtime must not.
"""
