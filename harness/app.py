"""Entry point: ``python -m harness`` composes the config and calls :func:`run`."""
from __future__ import annotations

import json
import logging
import time
import traceback
from pathlib import Path

from omegaconf import DictConfig, open_dict

from .config import validate
from .io import RunDir
from .io.rundir import FINISHED

log = logging.getLogger("harness")


def member_configs(cfg: DictConfig) -> list[DictConfig]:
    """Population member i is the lone run with seed ``seed + i`` (same config otherwise)."""
    out = []
    for i in range(cfg.population):
        m = cfg.copy()
        with open_dict(m):
            m.seed = int(cfg.seed) + i
            m.population = 1
            m.pop("hydra", None)
        out.append(m)
    return out


def get_trainer(family: str):
    if family == "control":
        from .train.control import train
    elif family == "lm":
        from .train.lm import train
    elif family == "toy":
        from .train.toy import train
    else:  # validate() has refused it already
        raise ValueError(f"task.family must be one of ['control', 'lm', 'toy'], got {family!r}")
    return train


def get_worker(cfg: DictConfig):
    """What runs on the members: the task family's trainer, or the gradient probes (mode=probe)."""
    if cfg.mode == "probe":
        from .probes import run_probe

        return run_probe
    return get_trainer(cfg.task.family)


def run(cfg: DictConfig) -> dict[str, int]:
    """Validate, skip finished members, train (or probe) the rest; returns counts by outcome.

    A run that raises is recorded as ``failed`` (with the traceback's last line as reason) and
    the sweep goes on; a non-finite loss or parameter is recorded as ``diverged`` by the trainer.
    """
    validate(cfg)
    runs = [RunDir(m) for m in member_configs(cfg)]
    todo = [r for r in runs if r.status() not in FINISHED]
    counts = {"skipped": len(runs) - len(todo)}
    for r in runs:
        if r not in todo:
            log.info("skip %s (already %s)", r.path, r.status())
    if not todo:
        return counts
    worker = get_worker(cfg)
    for r in todo:
        r.start()
    t0 = time.time()
    try:
        worker(cfg, todo)
    except Exception as exc:  # record, never drop
        reason = f"{type(exc).__name__}: {exc}"
        log.error("run failed: %s\n%s", reason, traceback.format_exc())
        for r in todo:
            if r.status() is None:
                r.finish("failed", reason, time.time() - t0)
    for r in todo:
        status = r.status() or "failed"
        counts[status] = counts.get(status, 0) + 1
    return counts


def write_outcome(counts: dict[str, int]) -> None:
    """Leave the job's outcome in Hydra's job folder for the end-of-sweep summary."""
    try:
        from hydra.core.hydra_config import HydraConfig

        out = Path(HydraConfig.get().runtime.output_dir) / "outcome.json"
        out.write_text(json.dumps(counts))
    except Exception:
        pass


def describe(counts: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items()) if v)


def main_entry(cfg: DictConfig) -> None:
    try:
        counts = run(cfg)
    except ValueError as exc:  # invalid config: nothing was started
        print(f"invalid config: {exc}")
        raise SystemExit(2)
    write_outcome(counts)
    print(f"[harness] {cfg.task.name}/{cfg.estimator} seed={cfg.seed}"
          f"{' population=' + str(cfg.population) if cfg.population > 1 else ''}: {describe(counts)}"
          f"  -> {cfg.results_dir}")
