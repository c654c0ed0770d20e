"""``fastasr-matrix [overrides]`` (what ``make matrix`` runs; also ``python -m fastasr.cli.matrix`` and,
by the outside contract's name, ``python -m fastasr.cross_eval``): compose
``conf/cross_eval.yaml``, run the matrix, print matrix.md, then where it is (``matrix: <dir>/matrix.md (every cell: <dir>/matrix.csv)``) as the last line.

Exits non-zero when a cell failed, naming matrix.csv.
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from fastasr.config import CONFIG_DIR
from fastasr.quiet import quiet_known_noise
from fastasr.studies.matrix.cells import CSV_FILE, MD_FILE
from fastasr.studies.matrix.running import run_matrix


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="cross_eval")
def main(cfg: DictConfig) -> None:
    """The Hydra entry point of the matrix."""
    quiet_known_noise()  # third-party messages that are not the user's to act on (fastasr.quiet)
    result = run_matrix(cfg, invocation=list(HydraConfig.get().overrides.task))
    print((result.matrix_dir / MD_FILE).read_text())
    print(f"matrix: {result.matrix_dir / MD_FILE} (every cell: {result.matrix_dir / CSV_FILE})", flush=True)
    if result.failed:
        raise SystemExit(f"{len(result.failed)} matrix cell(s) failed; see {result.matrix_dir / CSV_FILE}")


if __name__ == "__main__":
    main()
