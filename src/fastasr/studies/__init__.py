"""The studies built on training: :mod:`~fastasr.studies.matrix` (train with X, decode with Y:
Table 1), :mod:`~fastasr.studies.budget` (accuracy for a compute budget: Figure 1) and
:mod:`~fastasr.studies.report` (static HTML pages of runs and matrices).
"""
