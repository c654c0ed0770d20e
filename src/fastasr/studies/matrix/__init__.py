"""The approximation matrix (Table 1 of Vyas et al. 2020): train with X, evaluate with Y.

    fastasr-matrix [matrix=smoke|default|paper_wsj] [overrides]   (make matrix)

For every *train spec* (``full``, ``shared-full``, ``lsh-1``, …) a model is trained with
``python train.py experiment=matrix_member member=<spec>`` — here in-process, through the
same config, so a Hydra multirun of train.py (locally or on a cluster) produces exactly the
run directories looked for — or a finished one is reused. Each model is then decoded on the
dev split with every *eval spec*; the matrix directory ``${paths.output_dir}/matrix/<name>/``
receives ``matrix.csv`` (one row per pair), ``matrix.md`` (the paper's Table 1), ``matrix.png``
(a heatmap) and ``runs/<spec>/`` (the trained models).

Modules: :mod:`~fastasr.studies.matrix.rules` (what a spec stands for, shared Q/K, ``n/a`` pairs),
:mod:`~fastasr.studies.matrix.cells` (cells and matrix.csv), :mod:`~fastasr.studies.matrix.render`
(Markdown, HTML, heatmap), :mod:`~fastasr.studies.matrix.members` (composing and training each
model), :mod:`~fastasr.studies.matrix.dashboard` (the wandb table), :mod:`~fastasr.studies.matrix.running`
(the run loop); the command is :mod:`fastasr.cli.matrix`.
"""

from fastasr.studies.matrix.cells import (
    CSV_COLUMNS,
    CSV_FILE,
    FAILED,
    MD_FILE,
    MISSING,
    NA,
    OK,
    PNG_FILE,
    Cell,
    read_cells,
    write_cells,
)
from fastasr.studies.matrix.members import Member, compose_member
from fastasr.studies.matrix.render import (
    cell_notes,
    html_table,
    markdown_table,
    plot_heatmap,
    write_markdown,
)
from fastasr.studies.matrix.rules import SHARED_FULL, MatrixError, eval_attention, train_member
from fastasr.studies.matrix.running import MatrixResult, run_matrix

__all__ = [
    "CSV_COLUMNS", "CSV_FILE", "FAILED", "MD_FILE", "MISSING", "NA", "OK", "PNG_FILE", "SHARED_FULL",
    "Cell", "MatrixError", "MatrixResult", "Member", "cell_notes", "compose_member", "eval_attention",
    "html_table", "markdown_table", "plot_heatmap", "read_cells", "run_matrix", "train_member",
    "write_cells", "write_markdown",
]
