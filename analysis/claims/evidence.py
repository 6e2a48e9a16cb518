"""The evidence of a claim experiment: its expected run directories, which are finished, and
their tables (probe rows, per-batch probe values, training metrics), each tagged with the
sweep values of the config that made it.

Only *finished* runs are evidence, by the harness's own definition (:mod:`harness.io.finished`,
which also decides what ``python -m harness.experiments claims`` reruns). Every run directory
that is not evidence (not finished, a probe without probe.parquet, an unreadable file, +-inf in
``eval_return``/``episode_return``) is named with its reason (:meth:`ExpData.left_out`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from harness.experiments import NotComposed, Point
from harness.experiments import compose_points as _compose_points
from harness.experiments import run_command
from harness.experiments import sweep_params as _sweep_params
from harness.io.files import RunFileError, read_json, read_table
from harness.io.finished import FINISHED, MISSING, UNFINISHED, check_run

from ..load import nonfinite_score
from ..stats import DEFAULT_DIVERGED


class NotRun(Exception):
    """Evidence missing: the claim (or part) is not run: <reason>."""


def sweep_params(name: str, quick: bool) -> dict[str, str]:
    try:
        return _sweep_params(name, quick)
    except NotComposed as exc:
        raise NotRun(str(exc)) from None


def compose_points(name: str, root: Path, quick: bool, seed_offset: int = 0, extend: dict | None = None) -> list[Point]:
    try:
        return _compose_points(name, root, quick, seed_offset=seed_offset, extend=extend)
    except NotComposed as exc:
        raise NotRun(str(exc)) from None


def sweep_key(override: str) -> tuple[str, object]:
    """``"++probe.batches=4000"`` -> ``("probe.batches", 4000)``; values typed as YAML reads them
    (``null`` -> None, ``0.2`` -> 0.2, ``true`` -> True), as claims.yaml's selections are."""
    key, _, value = override.partition("=")
    try:
        v = yaml.safe_load(value)
    except yaml.YAMLError:
        v = value
    return key.lstrip("+~"), v


@dataclass
class ExpData:
    """Everything one experiment produced in DIR, restricted to its expected run directories.

    ``sweep``: one row per run directory with the value of every swept key of its config (the
    claims' selections refer to these, e.g. ``{clip_eps: null, epochs: 10}``)."""

    name: str
    runs: pd.DataFrame  # run_dir, status, reason, point (overrides)
    probe: pd.DataFrame
    batches: pd.DataFrame
    metrics: pd.DataFrame
    sweep: pd.DataFrame = field(default_factory=pd.DataFrame)
    points: list = field(default_factory=list)  # the composed configs (harness.experiments.Point)
    diverged: str = DEFAULT_DIVERGED  # how a diverged run scores after divergence (analysis.stats)

    def finished(self) -> pd.DataFrame:
        return self.runs[self.runs.status.isin(FINISHED)]

    def left_out(self) -> list[dict]:
        out = []
        for r in self.runs.itertuples():
            if r.status in FINISHED or r.status == "missing":
                continue
            where = r.run_dir if isinstance(r.run_dir, str) else f"{self.name} config [{r.point}]"
            why = r.reason if isinstance(r.reason, str) and r.reason else r.status
            if r.status == "error":
                why = f"config did not compose: {why}"
            out.append({"experiment": self.name, "path": where, "status": r.status, "reason": why})
        return out

    def missing(self) -> int:
        return int((self.runs.status == "missing").sum()) if len(self.runs) else 0

    def require(self, min_runs: int = 1) -> None:
        """NotRun with the most telling reason when this experiment has too few finished runs."""
        if self.runs.empty:
            raise NotRun(f"experiment {self.name} has no configs")
        if len(self.finished()) >= min_runs:
            return
        bad = self.runs[~self.runs.status.isin(FINISHED)]
        st = bad.status.value_counts().to_dict()
        reasons = list(bad.reason.dropna().unique())[:1]
        why = f"{self.name}: " + ", ".join(f"{v} {k}" for k, v in st.items())
        if reasons:
            why += f" ({reasons[0]})"
        if set(st) <= {"missing"}:
            why += f" (run them: {run_command(self.name)})"
        raise NotRun(why)

    def first_members(self, n: int) -> "ExpData":
        """The evidence of the first ``n`` members (seeds) of every training config: what a look
        of the sequential plan at ``n`` seeds per arm judges. Probe configs are kept whole."""
        keep = set()
        for p in self.points:
            dirs = [str(d) for d in p.run_dirs]
            keep.update(dirs[:n] if p.cfg is not None and p.cfg.mode == "train" else dirs)
        if not self.points:  # synthetic evidence without composed points: every run
            return self
        sub = lambda t: t[t["run_dir"].isin(keep)] if len(t) and "run_dir" in t else t  # noqa: E731
        out = ExpData(self.name, sub(self.runs), sub(self.probe), sub(self.batches), sub(self.metrics),
                      sub(self.sweep), self.points, self.diverged)
        return out

    def select(self, table: pd.DataFrame, where: dict | None, what: str) -> pd.DataFrame:
        """Rows of ``table`` whose run's sweep values (or, for keys not swept, the table's own
        columns) equal ``where``'s. Floats compare with np.isclose; None matches null/NaN."""
        if table is None or table.empty:
            raise NotRun(f"{self.name}: no {what}")
        out = table
        for key, want in (where or {}).items():
            if len(self.sweep) and key in self.sweep.columns:
                col = self.sweep.set_index("run_dir")[key]
                vals = out["run_dir"].map(col)
            elif key in out.columns:
                vals = out[key]
            else:
                raise NotRun(f"{self.name}: neither a swept key nor a column: {key}")
            out = out[_matches(vals, want)]
        if out.empty:
            raise NotRun(f"{self.name}: no {what} with {where}")
        return out


def _matches(vals: pd.Series, want) -> pd.Series:
    if isinstance(want, (list, tuple)):  # any of these values
        out = pd.Series(False, index=vals.index)
        for w in want:
            out |= _matches(vals, w)
        return out
    if want is None:
        return vals.isna() | vals.map(lambda v: v is None or (isinstance(v, str) and v.lower() in ("null", "none")))
    if isinstance(want, bool):
        return vals.map(lambda v: v is want or (isinstance(v, (bool, np.bool_)) and bool(v) == want)
                        or (isinstance(v, str) and v.lower() == str(want).lower()))
    if isinstance(want, (int, float)):
        num = pd.to_numeric(vals, errors="coerce").astype(float)
        return pd.Series(np.isclose(num.to_numpy(), float(want)), index=vals.index)
    return vals.astype(str) == str(want)


def _read(path: Path) -> pd.DataFrame:
    try:
        return read_table(path).to_pandas()  # harness.io.files: the one reader of run files
    except RunFileError as exc:
        raise _Unreadable(f"unreadable {path.name} ({exc.reason})") from None
    except Exception as exc:  # noqa: BLE001 - ArrowInvalid, OSError...: any means unreadable
        raise _Unreadable(f"unreadable {path.name} ({type(exc).__name__}: {exc})".splitlines()[0]) from None


class _Unreadable(Exception):
    pass


def load_points(name: str, points: list[Point]) -> ExpData:
    """The evidence of experiment ``name``: runs (one row per expected run directory, with
    status and reason) and the tables of the finished ones. Statuses: completed | diverged
    (evidence), incomplete (no summary.json), failed (or any other status a summary records),
    corrupt (a file unreadable or disagreeing), not probed, non-finite (+-inf score), missing
    (never run), error (config did not compose)."""
    runs, probes, batches, metrics, sweep = [], [], [], [], []
    for p in points:
        point = " ".join(p.overrides[3:])
        if p.error and not p.run_dirs:
            runs.append({"run_dir": None, "status": "error", "reason": p.error, "point": point})
            continue
        swept = dict(sweep_key(o) for o in p.sweep)
        for d in p.run_dirs:
            sweep.append({"run_dir": str(d), **swept})
            if not d.exists():
                status, reason = ("error", p.error) if p.error else ("missing", None)
                runs.append({"run_dir": str(d), "status": status, "reason": reason, "point": point})
                continue
            check = check_run(d)
            if check.finished:
                status, reason = check.status, None
                try:
                    reason = read_json(d / "summary.json").get("reason")
                except (OSError, ValueError, AttributeError):
                    pass
            elif check.kind == MISSING:
                status, reason = "incomplete", check.reason
            elif check.kind == UNFINISHED:
                status, reason = check.status, check.reason
            else:
                status, reason = "corrupt", check.reason
            if status in FINISHED and p.cfg is not None and p.cfg.mode == "probe" \
                    and not (d / "probe.parquet").is_file():
                status, reason = "not probed", "finished without probe.parquet (trained instead of probed)"
            tables = {}
            if status in FINISHED:
                try:
                    for f in ("probe.parquet", "probe_batches.parquet"):
                        if (d / f).is_file():
                            tables[f] = _read(d / f).assign(run_dir=str(d))
                    if (d / "metrics.parquet").is_file() and not (d / "probe.parquet").is_file():
                        m = _read(d / "metrics.parquet")
                        bad = nonfinite_score(m)
                        if bad is not None:
                            status, reason = "non-finite", bad
                        elif len(m):
                            tables["metrics"] = m.assign(status=status, run_dir=str(d))
                except _Unreadable as exc:
                    status, reason, tables = "corrupt", str(exc), {}
            runs.append({"run_dir": str(d), "status": status, "reason": reason, "point": point})
            if status not in FINISHED:
                continue
            if "probe.parquet" in tables:
                probes.append(tables["probe.parquet"])
            if "probe_batches.parquet" in tables:
                batches.append(tables["probe_batches.parquet"])
            if "metrics" in tables:
                metrics.append(tables["metrics"])
    cat = lambda xs: pd.concat(xs, ignore_index=True) if xs else pd.DataFrame()  # noqa: E731
    return ExpData(name, pd.DataFrame(runs), cat(probes), cat(batches), cat(metrics), pd.DataFrame(sweep), list(points))
