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
* a completed run with no finite value in either column (an env that never ended an episode,
  with ``eval_every=0``) is left out, named: it has no score (a diverged one is kept, to be
  scored its task's worst return);
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
import re
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from harness.io import schema
from harness.io.finished import (MISSING, RunFileError, check_iterations, check_parts, read_config, read_parquet,
                                 read_summary, unreadable_metrics)
from harness.io.files import read_yaml

__all__ = [
    "AnalysisWarning",
    "RUN_KEYS",
    "METRIC_COLUMNS",
    "HYPERPARAMETERS",
    "VARIANT_KEYS",
    "DIAGNOSTICS",
    "KINDS",
    "find_run_dirs",
    "run_configs",
    "run_kind",
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


def _points_to_dir(e: os.DirEntry) -> bool:
    """A symlink that leads to a directory (False for a dangling link or a loop of links)."""
    try:
        return e.is_dir()
    except OSError:  # ELOOP
        return False


def _walk(root: Path) -> tuple[list[str], list[str], set[str]]:
    """One pass over ``root``: ``(runs, links, with_metrics)``. ``runs``: every directory
    (``root`` itself included, as ".") holding metrics.parquet or summary.json; ``links``: every
    symlinked directory; ``with_metrics``: the runs holding metrics.parquet; all relative to
    root. Hidden directories are
    skipped and symlinked ones not followed (as ``os.walk`` does by default); both lists sorted
    as paths sort (part by part), so loading order, and hence row order, is deterministic."""
    runs, links, with_metrics = [], [], set()
    stack = [(os.fspath(root), "")]
    while stack:
        path, rel = stack.pop()
        files, subdirs = set(), []
        try:
            entries = os.scandir(path)
        except OSError:  # as os.walk: a folder that cannot be listed is skipped
            continue
        with entries:
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    if not e.name.startswith("."):
                        subdirs.append((e.path, f"{rel}/{e.name}" if rel else e.name))
                elif e.is_symlink() and _points_to_dir(e):
                    if not e.name.startswith("."):
                        links.append(f"{rel}/{e.name}" if rel else e.name)
                else:  # a file, or something that is not (harness.io.files names what it is when read)
                    files.add(e.name)
        if METRICS_FILE in files or SUMMARY_FILE in files:
            runs.append(rel or ".")
            if METRICS_FILE in files:
                with_metrics.add(rel or ".")
        stack.extend(subdirs)

    def parts(rel: str) -> list[str]:
        return [] if rel == "." else rel.split("/")

    runs.sort(key=parts)
    links.sort(key=parts)
    return runs, links, with_metrics


def find_run_dirs(path: str | os.PathLike) -> list[Path]:
    """Every directory under ``path`` (itself included) holding metrics.parquet or summary.json.

    Sorted, so loading order (and hence row order) is deterministic. Symlinked directories are
    not followed (:func:`left_out_links` names them).
    """
    root = Path(path)
    return [root / rel for rel in _walk(root)[0]]


def left_out_links(path: str | os.PathLike, links: list[str] | None = None) -> list[dict]:
    """Symlinked directories under ``path`` (not followed by :func:`find_run_dirs`):
    ``{"run_dir", "path", "reason"}`` each, the reason saying where the link points.
    ``links``: those directories relative to ``path``, where the caller has walked it already."""
    root = Path(path)
    real_root = root.resolve()
    out = []
    for rel in _walk(root)[1] if links is None else links:
        link = root / rel
        target = link.resolve()
        inside = target == real_root or real_root in target.parents
        where = ("inside the results folder: counted once, under its own path" if inside else
                 "outside the results folder: its runs are not part of this folder's results")
        out.append({"run_dir": rel, "path": link.as_posix(),
                    "reason": f"symlink to {target.as_posix()} ({where}); not followed"})
    return out


def _get(cfg, *keys):
    for key in keys:
        if not isinstance(cfg, dict) or key not in cfg:
            return None
        cfg = cfg[key]
    return cfg


def _identity(cfg: dict | None) -> dict:
    """task/estimator/seed/variant settings of a run's config (:func:`harness.io.finished.
    read_config`), used only to fill nulls in the metrics, and ``task.worst_return`` (a
    finite number, else absent)."""
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


#: The kinds of run directory a results folder may hold (:func:`run_kind`), with what each is.
KINDS = {
    "train": "training runs",
    "probe": "probe runs (mode=probe: gradient bias/variance at a frozen policy, probe.parquet)",
    "claims": "claim experiments' runs (a claim_* folder that `python -m analysis claims` judges)",
}
#: A folder of a claim experiment's runs: ``<claims folder>/<experiment>/`` (harness.experiments).
CLAIMS_FOLDER_PREFIX = "claim_"


def run_kind(rel: str, summary: dict | None) -> str:
    """The kind (:data:`KINDS`) of the run directory ``rel`` (relative to the loaded folder):
    ``probe`` when its summary.json records ``mode: probe`` (:mod:`harness.probes`), ``claims``
    when a folder between the loaded folder and the run is a claim experiment's
    (``claim_*``: harness.experiments writes each experiment to ``DIR/<experiment>``; loading that
    folder itself, or one below it, reads its runs as training runs), else ``train``."""
    if isinstance(summary, dict) and summary.get("mode") == "probe":
        return "probe"
    if any(part.startswith(CLAIMS_FOLDER_PREFIX) for part in Path(rel).parts[:-1]):
        return "claims"
    return "train"


#: A run directory the harness named: ``seed<seed>-<config hash>`` (harness.io.rundir.run_dir_for).
_HASHED_NAME = re.compile(r"seed-?\d+-([0-9a-f]{10})")


def run_configs(path: str | os.PathLike, run_dirs: list[str]) -> dict[str, dict]:
    """Each run directory's config as flat ``{"budget.env_steps": 50000, "lr": 0.001, ...}``:
    the part of config.yaml that decides what the run computes (the part the harness hashes
    into the directory's name, :func:`harness.io.rundir.config_hash`: no results_dir,
    population, threads, logger, ... and no key the harness added later at its default), less
    ``seed``. Lists and other non-scalars are JSON text, so every value compares and hashes.

    config.yaml is parsed once per config: per config hash (the ``seed<k>-<hash>`` name the
    harness gives a run directory: runs of one hash share their config but the seed), and for a
    directory named otherwise once per text of the file less its ``seed:`` line (a YAML parse
    costs about 20x a read: 10,000 runs of a few configs are a few parses); a run without a
    readable config.yaml gets ``{}``."""
    root = Path(path)
    parsed: dict = {}
    out = {}
    for rel in run_dirs:
        m = _HASHED_NAME.fullmatch(Path(rel).name)
        key = m.group(1) if m else _config_text(root / rel / CONFIG_FILE)
        if key is None or key not in parsed:
            flat = _flat_config(root / rel / CONFIG_FILE)
            if key is None:
                out[rel] = flat
                continue
            parsed[key] = flat
        out[rel] = parsed[key]
    return out


def _config_text(path: Path) -> bytes | None:
    """config.yaml's bytes less its top-level ``seed:`` line (None when it does not read)."""
    try:
        return re.sub(rb"(?m)^seed:.*$", b"", path.read_bytes())
    except OSError:
        return None


def _flat_config(path: Path) -> dict:
    from omegaconf import OmegaConf

    from harness.io.rundir import _hashed_part  # the hashed part of a config: one definition

    try:
        raw = read_yaml(path)
    except (RunFileError, OSError):
        return {}
    if not isinstance(raw, dict):
        return {}
    try:
        cfg = _hashed_part(OmegaConf.create(raw))
    except Exception:  # noqa: BLE001 - a config OmegaConf does not take (an interpolation): as written
        cfg = raw
    flat: dict = {}

    def walk(node: dict, prefix: str) -> None:
        for k, v in node.items():
            if isinstance(v, dict) and v:
                walk(v, f"{prefix}{k}.")
            else:
                flat[f"{prefix}{k}"] = v if v is None or isinstance(v, (str, int, float, bool)) else \
                    json.dumps(v, sort_keys=True, default=str)

    walk(cfg, "")
    flat.pop("seed", None)
    return flat


def _survey(root: Path, run_dirs: list[str], with_metrics: set[str]) -> list[dict]:
    """One record per run directory, from one read of its summary.json and its config
    (summary.json's ``config``, or config.yaml for older runs): rules 1-2 of the finished
    definition (:func:`harness.io.finished.check_parts`), status, identity. Rule 3 (the
    metrics' iterations) is left to the caller, which reads metrics.parquet anyway.
    ``run_dirs``, ``with_metrics``: :func:`_walk`'s, relative to ``root``."""
    recs = []
    for rel in run_dirs:
        run_dir = root / rel
        summary, bad = read_summary(run_dir)
        cfg, cfg_bad = read_config(run_dir, summary)
        parts = check_parts(summary, bad, cfg, cfg_bad)
        if parts.kind == MISSING:
            status = "incomplete"
        elif parts.status in ("completed", "diverged", "failed"):
            status = parts.status
        else:
            status = "unknown"
        reason = summary.get("reason") if summary is not None else None
        run_id = summary.get("run_id") if summary is not None else None
        if status == "unknown" and parts.status is None:
            reason = parts.reason
        recs.append({
            "run_dir": rel,
            "kind": run_kind(rel, summary),
            "status": status,
            "reason": None if reason is None else str(reason),
            "run_id": None if run_id is None else str(run_id),
            "has_metrics": rel in with_metrics,
            "finished": parts.finished,  # rules 1-2 so far
            "left_out": None if parts.finished else parts.reason,
            **{f"config_{k}": v for k, v in _identity(cfg).items()},
            "_parts": parts,
        })
    return recs


def _stack(tables: list[pa.Table]) -> pa.Table:
    """Stack per-run tables with Arrow's permissive promotion (int -> float, a column absent in
    an older run -> null). A column that is a string in one run and a number in another (which
    no promotion unifies) is read as strings in every run, with a warning."""
    first = tables[0].schema
    if (not any(pa.types.is_dictionary(f.type) for f in first)
            and all(t.schema.equals(first) for t in tables[1:])):  # one schema (one harness version): nothing to unify
        return pa.concat_tables(tables)
    # Dictionary-encoded columns (pandas categoricals) do not promote against plain ones.
    decoded = []
    for t in tables:
        if any(pa.types.is_dictionary(f.type) for f in t.schema):
            t = pa.table([c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in t.columns],
                         names=t.column_names)
        decoded.append(t)
    try:
        return pa.concat_tables(decoded, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as err:
        types: dict[str, set] = {}
        for t in decoded:
            for f in t.schema:
                types.setdefault(f.name, set()).add(f.type)
        mixed = []
        for name, ts in types.items():
            try:
                pa.unify_schemas([pa.schema([pa.field(name, t)]) for t in ts], promote_options="permissive")
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                mixed.append(name)
        _warn(f"metrics schemas do not unify in Arrow ({err}); column(s) {', '.join(sorted(mixed))} read as "
              f"strings")
        out = []
        for t in decoded:
            for name in mixed:
                if name in t.column_names:
                    i = t.column_names.index(name)
                    try:
                        t = t.set_column(i, name, t.column(name).cast(pa.string()))
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                        t = t.remove_column(i)
            out.append(t)
        return pa.concat_tables(out, promote_options="permissive")


def _empty_frame() -> pd.DataFrame:
    df = pd.DataFrame({c: pd.Series(dtype=object if c in _STRING_COLUMNS else float)
                       for c in METRIC_COLUMNS})
    for c in ["run_dir", "status", "reason"]:
        df[c] = pd.Series(dtype=object)
    df["worst_return"] = pd.Series(dtype=float)
    return df


_RUNS_COLUMNS = ["run_dir", "kind", "status", "reason", "run_id", "has_metrics", "finished", "left_out"]


def _runs_frame(recs: list[dict]) -> pd.DataFrame:
    rows = [{k: v for k, v in r.items() if k != "_parts"} for r in recs]
    return pd.DataFrame(rows, columns=None if rows else _RUNS_COLUMNS)


def _read_metrics(path: Path) -> tuple[pa.Table | None, str | None]:
    """``(table, None)``, or ``(None, why)`` for a file that does not read in full."""
    try:
        table = read_parquet(path)  # harness.io.files.read_table: the one reader of run files
        table.validate(full=True)
        return table, None
    except RunFileError as err:
        return None, f"unreadable {METRICS_FILE} ({err.reason})"
    except Exception as err:  # noqa: BLE001 - ArrowInvalid, OSError, ...: any means corrupt
        return None, f"unreadable {METRICS_FILE} ({type(err).__name__}: {err})".splitlines()[0]


def _read_all(paths: list[Path]) -> list[tuple[pa.Table | None, str | None]]:
    """:func:`_read_metrics` of every path, in order, on Arrow's threads
    (:func:`_on_arrow_threads`). Each file is read on its own, so a corrupt one is
    named by its own read, and the reads overlap: a parquet read releases the GIL. On 10,000
    small files this took less CPU than one ``pyarrow.dataset`` scan of them, whose footers
    would have to be read up front, one after another, to check every file's schema
    (benchmarks/analysis_load.py)."""
    return _on_arrow_threads(_read_metrics, paths)


def _on_arrow_threads(fn, items: list) -> list:
    """``[fn(x) for x in items]``, in order, on ``pa.cpu_count()`` threads (Arrow's own count;
    ``pa.set_cpu_count`` changes it), for work that releases the GIL; in this thread where
    there is one worker or one item."""
    workers = min(len(items), pa.cpu_count())
    if workers <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))


def _finish_checks(table: pa.Table, recs: list[dict], tables: list[pa.Table], counts: list[int]) -> None:
    """Rule 3 of the finished definition on the finished runs among ``recs``, whose metrics
    ``tables`` (``counts[k]`` rows each) are stacked in order in ``table``: where the stacked
    ``iteration`` column is plain numbers without nulls, every run's is compared with ``1..n``
    at once; every run found off (or every run, where the column is not plain numbers) gets
    :func:`harness.io.finished.check_iterations` on its own table, so each is named with its
    reason."""
    finished = np.array([r["finished"] for r in recs], dtype=bool)
    n = np.array([r["_parts"].iterations if r["finished"] else -1 for r in recs], dtype=np.int64)
    sizes = np.asarray(counts, dtype=np.int64)
    check = finished & (sizes != n)
    col = table.column("iteration") if "iteration" in table.column_names else None
    if col is None or col.null_count or not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        check = finished
    else:  # 1..n: each run's first value 1 and each step within it 1 (exact: 10,000 runs' worth of
        # row-sized temporaries, as comparing with a made 1..n would take, cost seconds of fresh memory)
        starts = np.cumsum(sizes) - sizes
        its = col.to_numpy()
        off = np.zeros(len(recs), dtype=bool)
        some = sizes > 0
        off[some] = its[starts[some]] != 1
        rows = np.flatnonzero(np.diff(its) != 1) + 1  # rows whose step from the row before is not 1
        run = np.searchsorted(starts, rows, side="right") - 1  # (an empty run shares the next one's start)
        off[run[starts[run] != rows]] = True  # a step into a run's first row is from the run before
        check |= finished & off
    for k in np.flatnonzero(check):
        rec, own = recs[k], tables[k]
        if "iteration" not in own.column_names:
            result = unreadable_metrics(rec["_parts"], KeyError("iteration"))
        else:
            result = check_iterations(rec["_parts"], own.column("iteration").to_pylist())
        rec["finished"], rec["left_out"] = result.finished, result.reason


def load_runs(path: str | os.PathLike) -> pd.DataFrame:
    """One row per run directory: ``run_dir, status, reason, run_id, has_metrics, finished,
    left_out`` (``finished``: :func:`harness.io.finished.check_run`, the harness's definition;
    ``left_out``: why a run is not finished, None when it is), plus ``config_*`` identity.

    Includes directories that only hold summary.json (a run that failed before logging)
    so they can be counted even though they contribute no metrics.
    """
    root = Path(path)
    run_dirs, _, with_metrics = _walk(root)
    recs = _survey(root, run_dirs, with_metrics)
    for rec in recs:
        if rec["finished"]:
            try:
                its = read_parquet(root / rec["run_dir"] / METRICS_FILE, columns=["iteration"])
                check = check_iterations(rec["_parts"], its.column("iteration").to_pylist())
            except Exception as exc:  # noqa: BLE001 - any failure means corrupt
                check = unreadable_metrics(rec["_parts"], exc)
            rec["finished"], rec["left_out"] = check.finished, check.reason
    return _runs_frame(recs)


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


def _sort_out(root: Path, recs: list[dict], kept: list[dict], table: pa.Table | None, counts: list[int],
              unread: dict, finished_only: bool) -> tuple[pd.DataFrame, list, list, np.ndarray]:
    """:func:`load`'s verdict on every surveyed run ``recs``: ``(runs, skipped, left_out, keep)``:
    the runs frame (:func:`load_runs`' columns, ``left_out`` filled), the unreadable metrics
    files, the runs left out (with why), and which of the ``kept`` runs (stacked in ``table``,
    ``counts[k]`` rows each) are loaded; ``unread``: id(run) -> why its metrics do not read."""
    runs = _runs_frame(recs)
    skipped, left_out = [], []

    def leave_out(i: int, rec: dict, why: str) -> None:
        parts_ = Path(rec["run_dir"]).parts
        task, est = rec.get("config_task"), rec.get("config_estimator")
        left_out.append({"run_dir": rec["run_dir"], "path": (root / rec["run_dir"]).as_posix(), "reason": why,
                         "kind": rec["kind"],
                         "task": task if isinstance(task, str) else (parts_[-3] if len(parts_) >= 3 else None),
                         "estimator": est if isinstance(est, str) else (parts_[-2] if len(parts_) >= 3 else None)})
        runs.at[i, "left_out"] = why

    # ±inf scores, looked for in all the stacked runs at once
    bad, unscored = _score_scan(table, counts) if kept else (set(), set())
    starts = np.cumsum(counts) - counts
    where = {id(rec): k for k, rec in enumerate(kept)}
    keep = np.array([rec["finished"] or not finished_only for rec in kept], dtype=bool)
    for i, rec in enumerate(recs):
        if finished_only and not rec["finished"]:
            leave_out(i, rec, rec["left_out"])
            if str(rec["left_out"]).startswith(f"unreadable {METRICS_FILE}"):
                skipped.append((root / rec["run_dir"] / METRICS_FILE).as_posix())
            continue
        if not rec["has_metrics"]:
            leave_out(i, rec, rec["left_out"] or f"no {METRICS_FILE}")
            continue
        k = where.get(id(rec))
        if k is None:  # (finished_only=False) its metrics do not read
            skipped.append((root / rec["run_dir"] / METRICS_FILE).as_posix())
            leave_out(i, rec, unread[id(rec)])
            continue
        why = nonfinite_score(table.slice(starts[k], counts[k])) if k in bad else None
        if why is None and k in unscored and rec["status"] == "completed":  # a diverged run scores its worst
            why = NO_SCORE
        if why is not None:
            keep[k] = False
            leave_out(i, rec, why)
    return runs, skipped, left_out, keep


def load(path: str | os.PathLike, *, finished_only: bool = True) -> pd.DataFrame:
    """Every finished run's ``metrics.parquet`` under ``path`` as one tidy frame (one row per
    iteration).

    Columns: every column of the output contract (null where a run did not log it), any
    extra columns runs logged, and ``run_dir`` (relative to ``path``), ``status``
    (completed | diverged; with ``finished_only=False`` also failed | incomplete | unknown),
    ``reason`` and ``worst_return`` (the run's ``task.worst_return``, NaN if none).

    Missing task/estimator/seed values are filled from the run's config, then from the
    ``<task>/<estimator>/<run>`` layout; a missing run_id from summary.json, then run_dir.
    ``df.attrs["left_out"]`` names every run directory not loaded: a list of ``{"run_dir",
    "path", "reason", "task", "estimator"}`` (not finished by the harness's definition, a
    ±inf score, a symlink not followed, an unreadable file). ``df.attrs["skipped"]`` lists
    the unreadable metrics files among them; ``df.attrs["runs"]`` is :func:`load_runs` of
    the folder.

    Each file is read once: summary.json and the run's config (summary.json's ``config``;
    config.yaml only for runs written before it) per run, then the metrics files, each on its
    own, on Arrow's CPU threads; their iterations are checked all at once, and each run found
    off is named with its reason.

    Raises FileNotFoundError / NotADirectoryError for a missing path or a file.
    """
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"{root} does not exist")
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a folder")

    run_dirs, links, with_metrics = _walk(root)
    recs = _survey(root, run_dirs, with_metrics)
    wanted = [r for r in recs if r["finished"] or (not finished_only and r["has_metrics"])]
    read = _read_all([root / r["run_dir"] / METRICS_FILE for r in wanted])
    unread = {}  # id(run) -> why its metrics do not read
    for rec, (t, why) in zip(wanted, read):
        if t is None:
            unread[id(rec)] = why
            if rec["finished"]:
                rec["finished"], rec["left_out"] = False, why
    kept = [rec for rec, (t, _) in zip(wanted, read) if t is not None]  # in order: they are stacked
    tables = [t for t, _ in read if t is not None]
    counts = [t.num_rows for t in tables]
    table = _stack([_without_own(t) for t in tables]) if tables else None
    if kept:
        _finish_checks(table, kept, tables, counts)
    del read, tables
    runs, skipped, left_out, keep = _sort_out(root, recs, kept, table, counts, unread, finished_only)
    if kept and not keep.all():
        table = table.filter(np.repeat(keep, counts))
        kept = [rec for rec, k in zip(kept, keep) if k]
        counts = [n for n, k in zip(counts, keep) if k]
    for link in left_out_links(root, links):
        left_out.append({**link, "task": None, "estimator": None})

    if not kept:
        df, codes = _empty_frame(), {}
        df["estimator_name"] = df["estimator"]
    else:
        held = [table]  # _frame takes the table's only reference, to free it as it converts
        del table
        df, codes = _frame(kept, counts, held)
    for c in METRIC_COLUMNS:  # numbers as float (string columns are objects with None already)
        if c not in _STRING_COLUMNS and df[c].dtype != np.float64:
            df[c] = pd.to_numeric(df[c], errors="coerce").astype(float)
    _label_variants_in_place(df, codes)
    lead = ["run_dir", "status"] + METRIC_COLUMNS + ["estimator_name"]
    df = df[lead + [c for c in df.columns if c not in lead]]
    df = _sort_rows(df, counts, codes)
    df.attrs["skipped"] = skipped
    df.attrs["left_out"] = left_out
    df.attrs["runs"] = runs
    return df


#: The loaded frame's row order: stable, nulls last.
SORT_COLUMNS = ["task", "estimator", "run_dir", "seed", "iteration"]


def _sort_rows(df: pd.DataFrame, counts: list[int], codes: dict) -> pd.DataFrame:
    """``df.sort_values(SORT_COLUMNS, kind="stable", na_position="last")`` with a fresh index,
    worked out on runs instead of rows where it can be. The rows come in blocks, one per run
    (``counts[k]`` rows each, in order); where task, the estimator's name and variant settings
    (by :func:`_frame`'s ``codes``) and seed are constant in every block and iteration increases
    within each, the sorted rows are the blocks sorted by (task, estimator, run_dir, seed) (run_dir
    differs between blocks), each kept as it is. So 10,000 runs' keys are sorted instead of 4M
    rows', and where the blocks are in order already (the walk sorts run directories as paths,
    which is this order in the ``<task>/<estimator>/<run>`` layout) no row is moved or copied.
    Anything else gets pandas' sort of the rows."""
    counts_ = np.asarray(counts, dtype=np.int64)
    starts = np.cumsum(counts_) - counts_
    if not _blockwise(df, counts_, starts, codes):
        return df.sort_values(SORT_COLUMNS, kind="stable", na_position="last").reset_index(drop=True)
    heads = df.take(starts)[SORT_COLUMNS[:-1]].reset_index(drop=True)  # one row per run
    order = heads.sort_values(SORT_COLUMNS[:-1], kind="stable", na_position="last").index.to_numpy()
    if np.array_equal(order, np.arange(len(order))):
        return df
    n = counts_[order]
    rows = np.repeat(starts[order] - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))
    return df.take(rows).reset_index(drop=True)


def _blockwise(df: pd.DataFrame, counts: np.ndarray, starts: np.ndarray, codes: dict) -> bool:
    """Whether :func:`_sort_rows` may sort ``df`` by runs: its rows are the blocks of ``counts``
    (first rows ``starts``), and in every block task, the estimator's name, the variant settings
    (by ``codes``) and seed are constant and iteration increases."""
    if df.empty or not len(counts) or int(counts.sum()) != len(df):
        return False
    first = np.repeat(starts, counts)  # each row's block's first row

    def constant(values: np.ndarray) -> bool:
        head = values[first]
        same = values == head
        if values.dtype.kind == "f":
            same |= np.isnan(values) & np.isnan(head)
        return bool(same.all())

    names = ["estimator_name", "task", *(k for k in VARIANT_KEYS if k in df.columns)]
    if not all(c in codes and constant(codes[c][0]) for c in names):
        return False
    if not constant(df["seed"].to_numpy(dtype=float, na_value=np.nan)):
        return False
    it = df["iteration"].to_numpy(dtype=float, na_value=np.nan)
    inside = np.ones(len(it), dtype=bool)
    inside[starts] = False  # a step from one block into the next is not a step within a block
    return not np.isnan(it).any() and bool((np.diff(it) > 0)[inside[1:]].all())


def _score_scan(table: pa.Table, counts: list[int]) -> tuple[set[int], set[int]]:
    """One pass over the scoring columns of the stacked ``table`` (runs of ``counts[k]`` rows
    each, in order): ``(nonfinite, unscored)``. ``nonfinite``: the runs whose scoring columns hold
    ±inf, or all of them where a scoring column is not numeric (each then gets
    :func:`nonfinite_score`'s message); ``unscored``: the runs with no finite value in any of
    :data:`SCORE_VALUE_COLUMNS` (not scored: a score NaN would count as one)."""
    row_run = np.repeat(np.arange(len(counts)), counts)
    bad = np.zeros(table.num_rows, dtype=bool)
    scored = np.zeros(len(counts), dtype=bool)
    for col in SCORE_VALUE_COLUMNS:
        if col not in table.column_names:
            continue
        try:
            vals = table.column(col).cast(pa.float64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return set(range(len(counts))), set()
        bad |= np.isinf(vals)
        scored[np.unique(row_run[np.isfinite(vals)])] = True
    return {int(k) for k in np.unique(row_run[bad])}, {int(k) for k in np.flatnonzero(~scored)}


#: Why a completed run without any finite score is left out.
NO_SCORE = ("no score: neither eval_return nor episode_return holds a finite value (no evaluation ran "
            "and no episode ended)")


#: The per-run columns load adds; a column of these names in a metrics file is dropped.
_OWN = ("run_dir", "status", "reason", "worst_return")


def _without_own(table: pa.Table) -> pa.Table:
    names = set(table.schema.names)
    return table.drop_columns([c for c in _OWN if c in names]) if names.intersection(_OWN) else table


def _frame(recs: list[dict], counts: list[int], held: list[pa.Table]) -> tuple[pd.DataFrame, dict]:
    """The kept runs' rows (``recs``, ``counts[k]`` rows each, stacked in order in the table
    ``held`` holds, which this takes from it: the table's memory is freed as it is converted,
    :func:`_to_pandas`), with identity filled from each run's config, then its layout (in
    Arrow, from one value per run taken to the rows, where a column has nulls), converted to
    pandas once, then the per-run columns (run_dir, status, reason, worst_return) added from one
    value per run as numpy arrays. Returns ``(frame, codes)``: the string columns are objects
    (None where null), the contract's number columns float, and ``codes`` holds
    :func:`_objects`' factorization of each contract column that was a string column, for
    :func:`_label_variants_in_place`."""
    table = held.pop()
    idx = pa.array(np.repeat(np.arange(len(recs), dtype=np.int32), counts))

    def per_run(values: list, typ: pa.DataType = pa.string()) -> pa.Array:
        return pa.array(values, typ).take(idx)

    def fill(table: pa.Table, col: str, values: list) -> pa.Table:
        """``col``'s nulls filled with each run's value of ``values``."""
        have = table.column(col)
        if have.null_count == 0:  # every row has its own value (the harness writes these): nothing to fill
            return table
        if pa.types.is_null(have.type):  # a column that is null in every run: take the config's type
            fallback = pa.array(values).take(idx)
            return table.set_column(table.column_names.index(col), col, fallback)
        try:
            fallback = per_run(values, have.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # e.g. a config seed of another type
            have, fallback = have.cast(pa.string()), per_run([None if v is None else str(v) for v in values])
        return table.set_column(table.column_names.index(col), col, pc.coalesce(have, fallback))

    for c, typ in schema.METRIC_COLUMNS.items():
        if c not in table.column_names:
            table = table.append_column(c, pa.nulls(table.num_rows, typ))
    for col in ["task", "estimator", "seed", *VARIANT_KEYS]:
        values = [r.get(f"config_{col}") for r in recs]
        if any(v is not None for v in values):
            table = fill(table, col, values)
    # Layout fallback: RESULTS/<task>/<estimator>/<run_name>/
    layout = [Path(r["run_dir"]).parts for r in recs]
    for col, k, default in (("task", -3, "unknown_task"), ("estimator", -2, "unknown_estimator")):
        table = fill(table, col, [p[k] if len(p) >= 3 else default for p in layout])
    table = fill(table, "run_id", [r["run_id"] if r["run_id"] is not None else r["run_dir"] for r in recs])
    # the contract's string columns become Python objects (None where null) from their few distinct
    # values, not one new str per row: pandas' own conversion of 4M rows took seconds per column
    names = [c for c in table.column_names if c in _STRING_COLUMNS]
    converted = {c: _objects(table.column(c)) for c in names}
    held.append(table.drop_columns(names))
    del table
    df = _to_pandas(held, {c for c in schema.METRIC_COLUMNS if c not in _STRING_COLUMNS})
    for c in names:  # each row's object, taken after the number columns (into the memory they freed)
        values, codes, _ = converted[c]
        df[c] = _object_series(values if codes is None else values[codes], df.index)
    # the per-run columns, from one value per run (strings as objects, as the contract's)
    rows = np.repeat(np.arange(len(recs)), counts)
    for c, values in (("run_dir", [r["run_dir"] for r in recs]), ("status", [r["status"] for r in recs]),
                      ("reason", [r["reason"] if isinstance(r["reason"], str) else None for r in recs])):
        per = np.empty(len(values), dtype=object)
        per[:] = values
        df[c] = _object_series(per[rows], df.index)
    df["worst_return"] = np.array([r.get("config_worst_return") for r in recs], dtype=float)[rows]
    df["estimator_name"] = df["estimator"]
    codes = {c: converted[c][1:] for c in names if converted[c][1] is not None}
    if "estimator" in codes:
        codes["estimator_name"] = codes["estimator"]
    return df, codes


#: Rows :func:`_to_pandas` converts at a time (the runs' memory is freed in steps of about this).
_BLOCK_ROWS = 1 << 16


def _to_pandas(held: list[pa.Table], floats: set[str] = frozenset()) -> pd.DataFrame:
    """The table ``held`` holds (taken from it: pass its only reference) as a frame whose every
    column is writable and its own, so ``df.loc[i, c] = v`` works as on any frame.

    Number columns (ints with nulls become float with NaN, as ``to_pandas`` makes them; the
    columns named in ``floats`` become float64) are copied :data:`_BLOCK_ROWS` rows at a time
    into arrays made for the frame, and the table's chunks are let go as
    soon as every column has been copied past them. A stacked table of 10,000 runs has 10,000
    chunks per column, each run's buffers side by side in memory; so the table is freed run
    by run while the frame is filled, and the frame reuses that memory instead of touching as
    much again (a first touch of memory is slow on some machines: ``benchmarks/analysis_load.py``). A number column null in every row is float
    NaN, and all such columns share one array until one of them is written (pandas' copy on
    write: a sweep of control runs has nine all-null LM columns, a quarter of the frame). Other
    types go through ``to_pandas`` (after the number columns, into the memory they freed) into
    consolidated blocks, which are always new arrays."""
    table = held.pop()
    n = table.num_rows
    numbers = [c for c, t in zip(table.column_names, table.schema.types)
               if pa.types.is_integer(t) or pa.types.is_floating(t)]
    empty = {c for c in numbers if n and table.column(c).null_count == n}
    numbers = [c for c in numbers if c not in empty]
    others = table.select([c for c in table.column_names if c not in numbers and c not in empty])
    arrays: dict = {}
    chunks, ends, types = {}, {}, {}  # each number column's chunks, where each ends, its type
    for c in numbers:
        col = table.column(c)
        types[c] = col.type
        as_float = c in floats or (col.null_count and pa.types.is_integer(col.type))
        arrays[c] = np.empty(n, dtype=np.float64 if as_float else col.type.to_pandas_dtype())
        chunks[c] = col.chunks
        ends[c] = np.cumsum([len(x) for x in chunks[c]], dtype=np.int64)
        del col
    order = table.column_names
    del table  # from here the number columns' chunks are held in ``chunks`` alone
    # blocks of about _BLOCK_ROWS rows that end where the first column's chunks end (the other
    # columns' chunks, read from the same files, end there too: whole chunks, none cut)
    bounds = [0]
    for e in (ends[numbers[0]] if numbers else []):
        if e > bounds[-1] and (e >= bounds[-1] + _BLOCK_ROWS or e == n):
            bounds.append(int(e))

    def copy(c: str, start: int, stop: int) -> None:  # column c's rows start:stop
        cs, end = chunks[c], ends[c]
        first, last = (int(i) for i in np.searchsorted(end, [start, stop], side="right"))
        if (end[first - 1] if first else 0) == start and (end[last - 1] if last else 0) == stop:
            pieces = cs[first:last]
        else:  # chunked otherwise (a column filled or made by load): the parts in the block
            pieces = []
            for i in range(first, min(last + 1, len(cs))):
                lo = int(end[i]) - len(cs[i])
                a, b = max(start, lo) - lo, min(stop, int(end[i])) - lo
                if b > a:
                    pieces.append(cs[i].slice(a, b - a))
        arrays[c][start:stop] = pa.chunked_array(pieces, types[c]).to_numpy()
        cs[first:last] = [None] * (last - first)  # the chunks that end by ``stop``: copied in full

    for start, stop in zip(bounds[:-1], bounds[1:]):  # the columns on Arrow's threads (the copies release the GIL)
        _on_arrow_threads(lambda c: copy(c, start, stop), numbers)  # noqa: B023 - called before the loop moves on
    rest = others.to_pandas(split_blocks=False)
    del others
    if empty:  # one all-NaN array behind every such column, copied by pandas (copy on write) when written
        nan = pd.Series(np.full(n, np.nan))
        arrays.update((c, nan) for c in empty)
    columns = {c: arrays[c] if c in arrays else rest[c] for c in order}
    return pd.DataFrame(columns, index=pd.RangeIndex(n), copy=False)


def _object_series(values: np.ndarray, index: pd.Index) -> pd.Series:
    """``values`` (an object array) as a column of dtype object: left to itself pandas would infer
    its ``str`` dtype and copy every value into Arrow."""
    return pd.Series(values, index=index, dtype=object, copy=False)


def _objects(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray | None, int]:
    """``(values, codes, n)``: ``col`` as Python objects, None where null: the rows' objects are
    ``values[codes]``. Strings go through their dictionary (each distinct value made once);
    ``values`` are then the n distinct values and None, and ``codes`` number the rows' values
    0..n-1 (null is n), a factorization for :func:`_label_variants_in_place`. Anything else is
    converted by pandas: ``values`` one object per row, codes None."""
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        enc = pc.dictionary_encode(col).combine_chunks()
        n = len(enc.dictionary)
        codes = enc.indices  # null (none, where load filled the column) is n
        codes = (codes if codes.null_count == 0 else codes.fill_null(n)).to_numpy(zero_copy_only=False)
        values = np.empty(n + 1, dtype=object)  # the last slot (null's code) stays None
        values[:-1] = enc.dictionary.to_pylist()
        return values, codes, n
    s = col.to_pandas().astype(object)
    return s.where(s.notna(), None).to_numpy(), None, 0


def variant_label(name: str, settings: list[str]) -> str:
    """An estimator label of :func:`label_variants`: ``name[update=clip, loss_agg=token]``
    (``settings``: the ``key=value`` that differ), the plain name when none differs."""
    return f"{name}[{', '.join(settings)}]" if settings else name


def split_label(label: str) -> tuple[str, str]:
    """The inverse of :func:`variant_label`: ``'grpo[update=clip]'`` -> ``('grpo', 'update=clip')``,
    ``'grpo'`` -> ``('grpo', '')``."""
    label = str(label)
    if label.endswith("]") and "[" in label:
        name, _, settings = label[:-1].partition("[")
        return name, settings
    return label, ""


def label_variants(df: pd.DataFrame) -> pd.DataFrame:
    """Give runs of one estimator that differ in a :data:`VARIANT_KEYS` setting their own
    ``estimator`` label, ``name[key=value, ...]`` (only the keys that differ for that name,
    over the whole frame so a label means the same on every task; ``null`` where a run did
    not record the setting). Names run with one setting keep the plain name. The registered
    name is (or stays) in ``estimator_name``. Returns a new frame: a shallow copy, which pandas'
    copy on write keeps apart from ``df`` (the data is copied only where one of them is written;
    a deep copy of a 10,000-run frame took 20 s, most of it consolidating its blocks)."""
    df = df.copy(deep=False)
    _label_variants_in_place(df)
    return df


def _label_variants_in_place(df: pd.DataFrame, known: dict | None = None) -> None:
    """:func:`label_variants` on ``df`` itself (load's frame is new already: no copy).
    ``known``: column -> ``(codes, n)``, a factorization of that column known already."""
    if "estimator_name" not in df.columns:
        df["estimator_name"] = df["estimator"]
    keys = [k for k in VARIANT_KEYS if k in df.columns]
    if not keys or df.empty:
        return
    # one label per distinct (name, settings) combination, worked out on the few combinations:
    # each column factorized on its own, the codes combined into one integer per row
    cols = [df["estimator_name"], *(df[k] for k in keys)]
    combined = np.zeros(len(df), dtype=np.int64)
    for name, col in zip(["estimator_name", *keys], cols):
        c, n = (known or {}).get(name) or (None, 0)
        if c is None:
            c, u = pd.factorize(col, use_na_sentinel=False)
            n = len(u)
        combined = combined * (n + 1) + c
    codes, uniques = pd.factorize(combined)
    first = np.empty(len(uniques), dtype=np.int64)  # each combination's first row
    first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)
    combos = pd.DataFrame({"name": cols[0].to_numpy(dtype=object)[first]})
    for k, col in zip(keys, cols[1:]):
        vals = col.to_numpy(dtype=object)[first]
        combos[k] = pd.Series(vals, dtype=object).where(pd.notna(vals), "null").astype(str).to_numpy()
    differs = {k: combos.groupby("name", dropna=False)[k].transform("nunique").to_numpy() > 1 for k in keys}
    labels = []
    for j, rec in enumerate(combos.to_dict("records")):
        differ = [f"{k}={rec[k]}" for k in keys if differs[k][j]]
        labels.append(variant_label(rec["name"], differ))
    df["estimator"] = _object_series(np.asarray(labels, dtype=object)[codes], df.index)
