"""``python -m harness.probes [overrides] [-m]``: the harness's Hydra app with ``mode=probe``.

Same config tree and run directories as ``python -m harness mode=probe``.
"""
import hydra
from omegaconf import open_dict

from harness.config import register_configs
from harness.probes import run

register_configs()


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def main(cfg) -> None:
    with open_dict(cfg):
        cfg.mode = "probe"
    try:
        counts = run(cfg)
    except ValueError as exc:  # invalid config: nothing was started
        print(f"invalid config: {exc}")
        raise SystemExit(2)
    done = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()) if v)
    print(f"[harness.probes] {cfg.task.name}/{cfg.estimator} seed={cfg.seed}: {done}  -> {cfg.results_dir}")


if __name__ == "__main__":
    main()
