"""``python -m harness [overrides]`` — see README."""
import hydra

from harness.app import main_entry
from harness.config import register_configs
from harness.tune import objective, wants_objective

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg) -> float | None:
    """Train (or skip) the runs of ``cfg``. Under ``hydra/sweeper=optuna`` the job returns the
    value the sweeper maximises (:func:`harness.tune.objective`); otherwise nothing."""
    main_entry(cfg)
    if not wants_objective():
        return None
    value = objective(cfg)
    print(f"[harness] objective (final score, harness.tune.objective) = {value:.4g}")
    return value


if __name__ == "__main__":
    main()
