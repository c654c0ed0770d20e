"""``python -m fastasr.budget [overrides]`` (what ``make budget`` runs): compose
``conf/budget.yaml``, run the study, print budget.md.

Exits non-zero when a member failed, naming budget.csv.
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from fastasr.budget.running import run_budget
from fastasr.budget.table import CSV_FILE, MD_FILE
from fastasr.config import CONFIG_DIR


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="budget")
def main(cfg: DictConfig) -> None:
    """The Hydra entry point of the budget study."""
    result = run_budget(cfg, invocation=list(HydraConfig.get().overrides.task))
    print((result.budget_dir / MD_FILE).read_text())
    if result.failed:
        raise SystemExit(f"{len(result.failed)} budget member(s) failed; see {result.budget_dir / CSV_FILE}")


if __name__ == "__main__":
    main()
