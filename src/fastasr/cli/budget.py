"""``fastasr-budget [overrides]`` (what ``make budget`` runs; or ``python -m fastasr.cli.budget``): compose
``conf/budget.yaml``, run the study, print budget.md, then where it is
(``budget: <dir>/budget.md (every member: <dir>/budget.csv)``) as the last line.

Exits non-zero when a member failed, naming budget.csv.
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from fastasr.config import CONFIG_DIR
from fastasr.quiet import quiet_known_noise
from fastasr.studies.budget.running import run_budget
from fastasr.studies.budget.table import CSV_FILE, MD_FILE


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="budget")
def main(cfg: DictConfig) -> None:
    """The Hydra entry point of the budget study."""
    quiet_known_noise()  # third-party messages that are not the user's to act on (fastasr.quiet)
    result = run_budget(cfg, invocation=list(HydraConfig.get().overrides.task))
    print((result.budget_dir / MD_FILE).read_text())
    print(f"budget: {result.budget_dir / MD_FILE} (every member: {result.budget_dir / CSV_FILE})", flush=True)
    if result.failed:
        raise SystemExit(f"{len(result.failed)} budget member(s) failed; see {result.budget_dir / CSV_FILE}")


if __name__ == "__main__":
    main()
