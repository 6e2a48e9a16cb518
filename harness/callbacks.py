"""Hydra callback: one line at the end of a sweep with how many runs were skipped, done, failed."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        totals: dict[str, int] = {}
        for f in Path(config.hydra.sweep.dir).glob("*/outcome.json"):
            try:
                for k, v in json.loads(f.read_text()).items():
                    totals[k] = totals.get(k, 0) + int(v)
            except (OSError, ValueError):
                continue
        if totals:
            listed = ", ".join(f"{v} {k}" for k, v in sorted(totals.items()) if v)
            print(f"[harness] sweep done: {listed} (skipped = already finished in {config.results_dir})")
