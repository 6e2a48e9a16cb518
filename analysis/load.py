"""Load a results folder into one tidy pandas frame.

A results folder holds run directories at any depth (usually
``RESULTS/<task>/<estimator>/<run_name>/``). A run directory is one that holds a
``metrics.parquet`` (one row per training iteration) and, once the run has ended, a
``summary.json`` whose ``status`` is ``completed``, ``diverged`` or ``failed``.

Rules (the output contract in docs/design.md "Outputs"):

* only *finished* runs are loaded (one definition, shared with the harness's skip-or-rerun:
  :func:`harness.io.finished.check_run`: summary.json a JSON object with a string status
  ``completed``/``diverged`` and an int ``iterations`` within config.yaml's
  ``budget.iterations``, metrics.parquet readable with iterations exactly ``1..n``); every
  other run directory is *left out* and named with its reason in ``df.attrs["left_out"]``
  (``load(path, finished_only=False)`` loads unfinished runs too, as they stand);
* a run whose ``eval_return`` or ``episode_return`` holds ±inf is left out (named): a
  non-finite score is neither averaged nor silently replaced by the other column (NaN/null
  means "not evaluated at this iteration" and is ignored, as before);
* a symlinked directory under the folder is not followed: it is named as left out (a link
  pointing outside the folder would mix other results in; one pointing inside would count
  its target twice);
* every ``metrics.parquet`` is read on its own, so one corrupt or half-copied file is
  named and left out, never fatal;
* schemas are unified with Arrow's permissive promotion (int -> float, string widths,
  a column absent in an older run becomes null), so runs of different vintages stack;
* each row gets ``run_dir`` (path of its run directory relative to the folder, POSIX
  separators) and ``status`` from ``summary.json`` (``incomplete`` when there is none yet,
  ``unknown`` when it is not a JSON object with a string status), plus ``reason``, and
  ``worst_return``: the run's ``task.worst_return`` in its config.yaml (a known lower bound on
  a return, :class:`harness.config.TaskConfig`; NaN when the run recorded none, e.g. one
  written before the field existed), which scores a diverged run (:mod:`analysis.stats`);
* diverged runs are kept: dropping them would hide the instability being measured;
* runs that differ in a :data:`VARIANT_KEYS` setting (``update``, the policy loss, and
  ``loss_agg``) are never pooled: where one estimator name was run with more than one such
  setting in the loaded folder, its rows get the label ``name[update=clip]`` (only the
  settings that differ, ``null`` for files older than those columns) in ``estimator``, so
  everything that groups by estimator keeps them apart; ``estimator_name`` always holds the
  registered name.

The columns and their types are those of :mod:`harness.io.schema`, shared with the writer.

The unit of analysis ("a run") is ``(run_dir, seed)``. The harness writes one directory per
population member; an older directory stacking several seeds (iterations ``1..n`` repeated) is
not finished by the shared definition and is left out, named.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from harness.io import schema
from harness.io.finished import MISSING, check_run, read_parquet, safe_load_yaml

__all__ = [
    "AnalysisWarning",
    "RUN_KEYS",
    "METRIC_COLUMNS",
    "HYPERPARAMETERS",
    "VARIANT_KEYS",
    "DIAGNOSTICS",
    "find_run_dirs",
    "load",
    "load_runs",
    "nonfinite_score",
    "left_out_links",
]

METRICS_FILE = "metrics.parquet"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.yaml"

#: Columns that identify one run (one seed of one run directory).
RUN_KEYS = ["run_dir", "seed"]

HYPERPARAMETERS = list(schema.HYPERPARAMETERS)
#: String settings that change the algorithm; runs differing in one are never pooled.
VARIANT_KEYS = list(schema.VARIANTS)
DIAGNOSTICS = list(schema.DIAGNOSTICS)
LM_COLUMNS = list(schema.LM_COLUMNS)
_STRING_COLUMNS = list(schema.STRING_COLUMNS)

#: Every column of the output contract; each is present in the loaded frame (null if absent).
METRIC_COLUMNS = list(schema.METRIC_COLUMNS)

STATUSES = ["completed", "diverged", "failed", "incomplete", "unknown"]

#: Columns a run is scored on (harness.io.scores.SCORE_COLUMNS): ±inf in either leaves it out.
SCORE_VALUE_COLUMNS = ("eval_return", "episode_return")


class AnalysisWarning(UserWarning):
    """Something about the results folder as a whole (runs left out are listed in
    ``df.attrs["left_out"]`` instead)."""


def _warn(message: str) -> None:
    warnings.warn(message, AnalysisWarning, stacklevel=3)


def find_run_dirs(path: str | os.PathLike) -> list[Path]:
    """Every directory under ``path`` (itself included) holding metrics.parquet or summary.json.

    Sorted, so loading order (and hence row order) is deterministic. Symlinked directories are
    not followed (:func:`left_out_links` names them).
    """
    root = Path(path)
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        if METRICS_FILE in filenames or SUMMARY_FILE in filenames:
            found.append(Path(dirpath))
    return sorted(found)


def left_out_links(path: str | os.PathLike) -> list[dict]:
    """Symlinked directories under ``path`` (not followed by :func:`find_run_dirs`):
    ``{"run_dir", "path", "reason"}`` each, the reason saying where the link points."""
    root = Path(path)
    real_root = root.resolve()
    out = []
    for dirpath, dirnames, _ in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for d in dirnames:
            link = Path(dirpath) / d
            if not link.is_symlink():
                continue
            target = link.resolve()
            inside = target == real_root or real_root in target.parents
            where = ("inside the results folder: counted once, under its own path" if inside else
                     "outside the results folder: its runs are not part of this folder's results")
            out.append({"run_dir": _rel(link, root), "path": link.as_posix(),
                        "reason": f"symlink to {target.as_posix()} ({where}); not followed"})
    return sorted(out, key=lambda r: r["run_dir"])


def _rel(run_dir: Path, root: Path) -> str:
    return run_dir.relative_to(root).as_posix()


def _read_summary(run_dir: Path) -> dict:
    """status/reason/run_id of one run plus the shared finished check (no warning: a run
    that is not finished is named in ``left_out`` instead)."""
    check = check_run(run_dir)
    summary = None
    if check.status is not None:
        try:
            summary = json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):  # changed under our feet: the check's verdict stands
            summary = None
    if check.kind == MISSING:
        status = "incomplete"
    elif check.status in ("completed", "diverged", "failed"):
        status = check.status
    else:
        status = "unknown"
    reason = summary.get("reason") if isinstance(summary, dict) else None
    run_id = summary.get("run_id") if isinstance(summary, dict) else None
    if status == "unknown" and check.status is None:
        reason = check.reason
    return {"status": status, "reason": None if reason is None else str(reason),
            "summary_run_id": None if run_id is None else str(run_id),
            "finished": check.finished, "left_out": None if check.finished else check.reason}


def _get(cfg, *keys):
    for key in keys:
        if not isinstance(cfg, dict) or key not in cfg:
            return None
        cfg = cfg[key]
    return cfg


def _read_config(run_dir: Path) -> dict:
    """task/estimator/seed from config.yaml, used only to fill nulls in the metrics, and
    ``task.worst_return`` (a finite number, else absent)."""
    path = run_dir / CONFIG_FILE
    if not path.exists():
        return {}
    try:
        cfg = safe_load_yaml(path.read_text(encoding="utf-8"))
    except Exception:  # noqa: BLE001 - any parse failure means "no config" (check_run names it)
        return {}
    if not isinstance(cfg, dict):
        return {}
    out = {}
    task = cfg.get("task")
    if isinstance(task, dict):
        task = _get(task, "name") or _get(task, "env_id") or _get(task, "id")
    estimator = cfg.get("estimator")
    if isinstance(estimator, dict):
        estimator = _get(estimator, "name")
    if isinstance(task, str):
        out["task"] = task
    if isinstance(estimator, str):
        out["estimator"] = estimator
    if isinstance(cfg.get("seed"), (int, float)) and not isinstance(cfg.get("seed"), bool):
        out["seed"] = cfg["seed"]
    for key in VARIANT_KEYS:  # written to the metrics too since they joined the schema
        if isinstance(cfg.get(key), str):
            out[key] = cfg[key]
    worst = _get(cfg, "task", "worst_return")
    if isinstance(worst, (int, float)) and not isinstance(worst, bool) and math.isfinite(worst):
        out["worst_return"] = float(worst)
    return out


def _read_metrics(path: Path) -> tuple[pa.Table | None, str | None]:
    """``(table, None)``, or ``(None, why)`` for a file that does not read in full."""
    try:
        table = read_parquet(path)
        table.validate(full=True)
        return table, None
    except Exception as err:  # noqa: BLE001 - ArrowInvalid, OSError, ...: any means corrupt
        return None, f"unreadable {METRICS_FILE} ({type(err).__name__}: {err})".splitlines()[0]


def _concat(tables: list[pa.Table]) -> pd.DataFrame:
    """Stack per-run tables: Arrow permissive promotion, pandas as the fallback."""
    # Dictionary-encoded columns (pandas categoricals) do not promote against plain ones.
    tables = [t.unify_dictionaries() if any(pa.types.is_dictionary(f.type) for f in t.schema) else t
              for t in tables]
    decoded = []
    for t in tables:
        cols = [c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in t.columns]
        decoded.append(pa.table(cols, names=t.column_names))
    try:
        table = pa.concat_tables(decoded, promote_options="permissive")
        return table.to_pandas()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as err:
        # e.g. a column that is a string in one run and a float in another.
        _warn(f"metrics schemas do not unify in Arrow ({err}); stacking with pandas instead")
        frames = [t.to_pandas() for t in decoded]
        return pd.concat([f for f in frames if len(f.columns)], ignore_index=True, sort=False)


def _empty_frame() -> pd.DataFrame:
    df = pd.DataFrame({c: pd.Series(dtype=object if c in _STRING_COLUMNS else float)
                       for c in METRIC_COLUMNS})
    for c in ["run_dir", "status", "reason"]:
        df[c] = pd.Series(dtype=object)
    df["worst_return"] = pd.Series(dtype=float)
    return df


_RUNS_COLUMNS = ["run_dir", "status", "reason", "run_id", "has_metrics", "finished", "left_out"]


def load_runs(path: str | os.PathLike) -> pd.DataFrame:
    """One row per run directory: ``run_dir, status, reason, run_id, has_metrics, finished,
    left_out`` (``finished``: :func:`harness.io.finished.check_run`, the harness's definition;
    ``left_out``: why a run is not finished, None when it is), plus ``config_*`` identity.

    Includes directories that only hold summary.json (a run that failed before logging)
    so they can be counted even though they contribute no metrics.
    """
    root = Path(path)
    rows = []
    for run_dir in find_run_dirs(root):
        info = _read_summary(run_dir)
        rows.append({
            "run_dir": _rel(run_dir, root),
            "status": info["status"],
            "reason": info["reason"],
            "run_id": info["summary_run_id"],
            "has_metrics": (run_dir / METRICS_FILE).exists(),
            "finished": info["finished"],
            "left_out": info["left_out"],
            **{f"config_{k}": v for k, v in _read_config(run_dir).items()},
        })
    return pd.DataFrame(rows, columns=None if rows else _RUNS_COLUMNS)


def nonfinite_score(table: pa.Table | pd.DataFrame) -> str | None:
    """Why a run's scoring columns cannot be scored (±inf in ``eval_return`` or
    ``episode_return``, with the first iterations where it occurs), else None."""
    for col in SCORE_VALUE_COLUMNS:
        if isinstance(table, pa.Table):
            if col not in table.column_names:
                continue
            try:
                vals = table.column(col).cast(pa.float64()).to_numpy(zero_copy_only=False)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                return f"{col} is not numeric ({table.schema.field(col).type})"
            its = (table.column("iteration").to_pylist() if "iteration" in table.column_names
                   else list(range(1, len(vals) + 1)))
        else:
            if col not in table.columns:
                continue
            vals = pd.to_numeric(table[col], errors="coerce").to_numpy(dtype=float)
            its = table["iteration"].tolist() if "iteration" in table.columns else list(range(1, len(vals) + 1))
        bad = np.isinf(vals)
        if bad.any():
            at = [its[i] for i in np.flatnonzero(bad)[:3]]
            more = ", ..." if bad.sum() > 3 else ""
            kinds = sorted({"inf" if v > 0 else "-inf" for v in vals[bad]})
            return (f"{col} holds {'/'.join(kinds)} at iteration {', '.join(str(i) for i in at)}{more}: "
                    f"a non-finite score is not scored (nor replaced by another column)")
    return None


def load(path: str | os.PathLike, *, finished_only: bool = True) -> pd.DataFrame:
    """Every finished run's ``metrics.parquet`` under ``path`` as one tidy frame (one row per
    iteration).

    Columns: every column of the output contract (null where a run did not log it), any
    extra columns runs logged, and ``run_dir`` (relative to ``path``), ``status``
    (completed | diverged; with ``finished_only=False`` also failed | incomplete | unknown),
    ``reason`` and ``worst_return`` (the run's config.yaml ``task.worst_return``, NaN if none).

    Missing task/estimator/seed values are filled from the run's config.yaml, then from the
    ``<task>/<estimator>/<run>`` layout; a missing run_id from summary.json, then run_dir.
    ``df.attrs["left_out"]`` names every run directory not loaded: a list of ``{"run_dir",
    "path", "reason", "task", "estimator"}`` (not finished by the harness's definition, a
    ±inf score, a symlink not followed, an unreadable file). ``df.attrs["skipped"]`` lists
    the unreadable metrics files among them; ``df.attrs["runs"]`` is :func:`load_runs` of
    the folder.

    Raises FileNotFoundError / NotADirectoryError for a missing path or a file.
    """
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"{root} does not exist")
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a folder")

    runs = load_runs(root)
    tables, skipped, left_out = [], [], []

    def leave_out(rec: dict, why: str) -> None:
        parts = Path(rec["run_dir"]).parts
        task, est = rec.get("config_task"), rec.get("config_estimator")
        left_out.append({"run_dir": rec["run_dir"], "path": (root / rec["run_dir"]).as_posix(), "reason": why,
                         "task": task if isinstance(task, str) else (parts[-3] if len(parts) >= 3 else None),
                         "estimator": est if isinstance(est, str) else (parts[-2] if len(parts) >= 3 else None)})
        runs.loc[runs["run_dir"] == rec["run_dir"], "left_out"] = why

    for rec in runs.to_dict("records"):
        if finished_only and not rec["finished"]:
            leave_out(rec, rec["left_out"])
            if str(rec["left_out"]).startswith(f"unreadable {METRICS_FILE}"):
                skipped.append((root / rec["run_dir"] / METRICS_FILE).as_posix())
            continue
        if not rec["has_metrics"]:
            leave_out(rec, rec["left_out"] or f"no {METRICS_FILE}")
            continue
        run_dir = root / rec["run_dir"]
        reason = rec["reason"] if isinstance(rec["reason"], str) else None  # NaN from pandas
        table, why = _read_metrics(run_dir / METRICS_FILE)
        if table is None:
            skipped.append((run_dir / METRICS_FILE).as_posix())
            leave_out(rec, why)
            continue
        bad = nonfinite_score(table)
        if bad is not None:
            leave_out(rec, bad)
            continue
        n = table.num_rows
        worst = rec.get("config_worst_return")
        worst = float(worst) if isinstance(worst, (int, float)) and math.isfinite(worst) else None  # NaN: none
        table = table.drop_columns([c for c in ("run_dir", "status", "reason", "worst_return")
                                    if c in table.column_names])
        table = table.append_column("run_dir", pa.array([rec["run_dir"]] * n, pa.string()))
        table = table.append_column("status", pa.array([rec["status"]] * n, pa.string()))
        table = table.append_column("reason", pa.array([reason] * n, pa.string()))
        table = table.append_column("worst_return", pa.array([worst] * n, pa.float64()))
        tables.append((rec, table))
    for link in left_out_links(root):
        left_out.append({**link, "task": None, "estimator": None})

    if not tables:
        df = _empty_frame()
    else:
        df = _concat([t for _, t in tables])
        for c in METRIC_COLUMNS:
            if c not in df.columns:
                df[c] = None if c in _STRING_COLUMNS else np.nan
        df = _fill_identity(df, runs, root)
    df["estimator_name"] = df["estimator"]

    for c in METRIC_COLUMNS:
        if c not in _STRING_COLUMNS:
            df[c] = pd.to_numeric(df[c], errors="coerce").astype(float)
        else:
            df[c] = df[c].astype(object).where(df[c].notna(), None)
    df["estimator_name"] = df["estimator_name"].astype(object)
    df = label_variants(df)
    lead = ["run_dir", "status"] + METRIC_COLUMNS + ["estimator_name"]
    df = df[lead + [c for c in df.columns if c not in lead]]
    sort_cols = ["task", "estimator", "run_dir", "seed", "iteration"]
    df = df.sort_values(sort_cols, kind="stable", na_position="last").reset_index(drop=True)
    df.attrs["skipped"] = skipped
    df.attrs["left_out"] = left_out
    df.attrs["runs"] = runs
    return df


def label_variants(df: pd.DataFrame) -> pd.DataFrame:
    """Give runs of one estimator that differ in a :data:`VARIANT_KEYS` setting their own
    ``estimator`` label, ``name[key=value, ...]`` (only the keys that differ for that name,
    over the whole frame so a label means the same on every task; ``null`` where a run did
    not record the setting). Names run with one setting keep the plain name. The registered
    name is (or stays) in ``estimator_name``. Returns a new frame."""
    df = df.copy()
    if "estimator_name" not in df.columns:
        df["estimator_name"] = df["estimator"]
    keys = [k for k in VARIANT_KEYS if k in df.columns]
    if not keys or df.empty:
        return df
    name = df["estimator_name"].astype(object)
    vals = {k: df[k].astype(object).where(df[k].notna(), "null").astype(str) for k in keys}
    n_values = {k: vals[k].groupby(name.to_numpy()).transform("nunique").to_numpy() for k in keys}
    # one label per distinct (name, settings, which differ) combination, not per row
    combo = pd.DataFrame({"name": name.to_numpy(), **{k: vals[k].to_numpy() for k in keys},
                          **{f"_n_{k}": n_values[k] > 1 for k in keys}})
    codes, uniques = pd.factorize(pd.MultiIndex.from_frame(combo))
    labels = []
    for u in uniques:
        rec = dict(zip(combo.columns, u))
        differ = [f"{k}={rec[k]}" for k in keys if rec[f"_n_{k}"]]
        labels.append(f"{rec['name']}[{', '.join(differ)}]" if differ else rec["name"])
    df["estimator"] = np.asarray(labels, dtype=object)[codes]
    return df


def _fill_identity(df: pd.DataFrame, runs: pd.DataFrame, root: Path) -> pd.DataFrame:
    info = runs.set_index("run_dir")
    for col in ["task", "estimator", "seed", *VARIANT_KEYS]:
        cfg_col = f"config_{col}"
        if cfg_col in info.columns:
            df[col] = df[col].where(df[col].notna(), df["run_dir"].map(info[cfg_col]))
    # Layout fallback: RESULTS/<task>/<estimator>/<run_name>/ (parsed once per run, not per row)
    parts = {d: Path(d).parts for d in df["run_dir"].unique()}
    layout_task = df["run_dir"].map({d: p[-3] if len(p) >= 3 else None for d, p in parts.items()})
    layout_est = df["run_dir"].map({d: p[-2] if len(p) >= 3 else None for d, p in parts.items()})
    df["task"] = df["task"].where(df["task"].notna(), layout_task)
    df["estimator"] = df["estimator"].where(df["estimator"].notna(), layout_est)
    df["task"] = df["task"].where(df["task"].notna(), "unknown_task")
    df["estimator"] = df["estimator"].where(df["estimator"].notna(), "unknown_estimator")
    df["run_id"] = df["run_id"].where(df["run_id"].notna(), df["run_dir"].map(info["run_id"]))
    df["run_id"] = df["run_id"].where(df["run_id"].notna(), df["run_dir"])
    return df
