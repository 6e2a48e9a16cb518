"""Run directories: path from the resolved config, atomic files, completion marker.

Layout (DESIGN.md, "Outputs")::

    <results_dir>/<task.name>/<estimator>/seed<seed>-<hash>/
        config.yaml        resolved config, written first
        metrics.parquet    one row per iteration (rewritten atomically as the run goes)
        summary.json       written last: its presence marks the run finished

``hash`` covers the resolved config except ``seed`` (in the name), ``results_dir``,
``population``, ``progress`` and ``threads``: a population member and a lone run of the same seed share a
directory, and a rerun of the same sweep finds finished runs and skips them.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from omegaconf import DictConfig, OmegaConf

FINISHED = ("completed", "diverged")
_NOT_HASHED = ("seed", "results_dir", "population", "progress", "threads")
_NOT_HASHED_NESTED = (("lm", "cache_dir"),)  # where a cache lives does not change the run

# Columns every metrics.parquet carries (nulls where a value does not apply).
METRIC_COLUMNS: dict[str, pa.DataType] = {
    "run_id": pa.string(), "task": pa.string(), "estimator": pa.string(), "seed": pa.int64(),
    "iteration": pa.int64(), "env_steps": pa.int64(), "wall_time_s": pa.float64(),
    "episode_return": pa.float64(), "eval_return": pa.float64(),
    "gamma": pa.float64(), "gae_lambda": pa.float64(), "clip_eps": pa.float64(),
    "kl_beta": pa.float64(), "n_steps": pa.int64(), "group_size": pa.int64(), "lr": pa.float64(),
    "policy_loss": pa.float64(), "entropy": pa.float64(), "approx_kl": pa.float64(),
    "clip_frac": pa.float64(), "grad_norm": pa.float64(), "adv_mean": pa.float64(),
    "adv_std": pa.float64(), "value_loss": pa.float64(), "explained_variance": pa.float64(),
    "reward": pa.float64(), "gold_reward": pa.float64(), "kl_ref": pa.float64(),
    "response_len": pa.float64(), "tokens": pa.int64(),
}


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def _hashed_part(cfg: DictConfig) -> dict:
    d = OmegaConf.to_container(cfg, resolve=True)
    for key in _NOT_HASHED:
        d.pop(key, None)
    for key in ("toy", "probe"):  # task-specific nodes added later: keep older hashes valid
        if d.get(key) is None:
            d.pop(key, None)
    for parent, key in _NOT_HASHED_NESTED:
        if isinstance(d.get(parent), dict):
            d[parent].pop(key, None)
    d.pop("hydra", None)
    return d


def config_hash(cfg: DictConfig) -> str:
    blob = json.dumps(_hashed_part(cfg), sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:10]


def run_dir_for(cfg: DictConfig) -> Path:
    return Path(cfg.results_dir) / str(cfg.task.name) / str(cfg.estimator) / f"seed{cfg.seed}-{config_hash(cfg)}"


def run_status(path: Path) -> str | None:
    """Status in summary.json, or None when the run has not finished (or the file is unreadable)."""
    try:
        return json.loads((Path(path) / "summary.json").read_text()).get("status")
    except (OSError, ValueError):
        return None


def versions() -> dict[str, str]:
    """Installed versions, read from package metadata (importing transformers would cost seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for dist in ("torch", "gymnasium", "transformers", "hydra-core", "pyarrow", "numpy"):
        try:
            out[dist.replace("-core", "")] = version(dist)
        except PackageNotFoundError:  # pragma: no cover - optional
            pass
    return out


def git_commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except Exception:
        return None


class RunDir:
    """One run's directory: config first, metrics as they come, summary last."""

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        self.path = run_dir_for(cfg)
        self.run_id = f"{cfg.task.name}/{cfg.estimator}/{self.path.name}"
        self.rows: list[dict] = []

    def status(self) -> str | None:
        return run_status(self.path)

    def start(self) -> None:
        """Clear whatever an interrupted attempt left, then write config.yaml."""
        self.path.mkdir(parents=True, exist_ok=True)
        for name in ("summary.json", "metrics.parquet"):
            (self.path / name).unlink(missing_ok=True)
        atomic_write_text(self.path / "config.yaml", OmegaConf.to_yaml(self.cfg, resolve=True))

    def log(self, row: dict) -> None:
        self.rows.append(row)

    def flush(self) -> None:
        columns = dict(METRIC_COLUMNS)
        for row in self.rows:
            for key, value in row.items():
                if key not in columns:
                    columns[key] = pa.string() if isinstance(value, str) else pa.int64() if (
                        isinstance(value, int) and not isinstance(value, bool)) else pa.float64()
        arrays = {k: pa.array([r.get(k) for r in self.rows], type=t) for k, t in columns.items()}
        table = pa.table(arrays)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        atomic_write_bytes(self.path / "metrics.parquet", sink.getvalue().to_pybytes())

    def finish(self, status: str, reason: str | None, wall_time_s: float, extra: dict | None = None) -> None:
        self.flush()
        final = {}
        if self.rows:
            last = self.rows[-1]
            final = {k: v for k, v in last.items() if isinstance(v, (int, float)) and v is not None}
            evals = [r["eval_return"] for r in self.rows if r.get("eval_return") is not None]
            if evals:
                final["eval_return"] = evals[-1]
        summary = {
            "run_id": self.run_id, "status": status, "reason": reason, "final": final,
            "wall_time_s": wall_time_s, "iterations": len(self.rows), "versions": versions(),
            "git_commit": git_commit(), **(extra or {}),
        }
        atomic_write_json(self.path / "summary.json", summary)
