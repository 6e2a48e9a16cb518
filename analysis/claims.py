"""Claims report: ``python -m analysis claims DIR [--quick]``.

Every claim C1-C22 of CLAIMS.md gets a row: source document, experiment (``conf/experiment/
claim_*.yaml``), statistic, 95% interval, n, verdict - **supported**, **refuted** or
**inconclusive**. The verdict rules are code in this module (:data:`CLAIMS`, each with its rule
text, statistic, threshold and direction), fixed before any data is read, stated in the report,
and applied only to runs the harness produced in ``DIR`` for exactly the configs of the
experiment (the run directories are derived from the composed configs, so other runs lying in
the folder are never mixed in). Exact claims (C1, C2, C7, C12, C16) quote the pytest node ids
that check them and their outcome as recorded in ``DIR/exact_tests.json``.

This module only reads: the runs and the test outcomes are produced by the harness,
``python -m harness.experiments claims DIR [--quick]`` (:mod:`harness.experiments`, which also
holds what each claim needs run: :data:`~harness.experiments.CLAIM_EXPERIMENTS`,
:data:`~harness.experiments.EXACT_TESTS` and the sweeps, expanded by Hydra).

Rules, with an interval ``[lo, hi]`` of a statistic ``s``:

* effect ``s > t``: supported if ``lo > t``, refuted if ``hi < t``, else inconclusive;
* effect ``s < t``: the mirror image;
* null ``s = 0`` within a tolerance ``tol``: refuted if the interval excludes 0 (an effect was
  detected), supported if it contains 0 *and* lies inside ``[-tol, tol]``, else inconclusive
  (too wide to tell). A null effect is therefore never "found" by a wide interval, and a true
  effect is never called a null.

A claim with several parts is supported when every part is, refuted when any part is, and
inconclusive otherwise. A claim whose runs are missing or failed is "inconclusive - not run:
<reason>" (never a made-up verdict).

Only *finished* runs are evidence, by the harness's own definition (:mod:`harness.io.finished`,
which also decides what ``python -m harness.experiments claims`` reruns): a summary.json saying
completed over a corrupt or short metrics.parquet is not finished. Every run directory that is
not evidence (not finished, a probe without probe.parquet, an unreadable file, ±inf in
``eval_return``/``episode_return``) is named with its reason under "Runs left out" in
claims.md and printed; run directories never run are counted there.

``--quick`` reports on the quick variant of the same experiments (smaller budgets: fewer batches,
seeds and steps; wider intervals; LM task skipped), whose runs lie beside the full ones (other
config hashes) after ``python -m harness.experiments claims DIR --quick``.
"""
from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from harness.experiments import CLAIM_EXPERIMENTS, EXACT_TESTS, EXPERIMENTS, NotComposed, Point
from harness.experiments import compose_points as _compose_points
from harness.experiments import lm_unavailable
from harness.experiments import sweep_params as _sweep_params
from harness.io import atomic_write_json, atomic_write_text
from harness.io.finished import FINISHED, MISSING, UNFINISHED, check_run
from harness.probes.stats import percentile_interval  # one percentile rule for probes and claims

from .load import nonfinite_score
from .stats import iqm, run_table

CONFIDENCE = 0.95
REPS = 2000
SEED = 0
BIAS_TOL_SQ = 0.01  # null-bias tolerance: relative bias |E g - grad J| / |grad J| <= 0.1
EXACT_ZERO = 1e-9  # "the same advantage for every token": within-response std below this

REPO = Path(__file__).resolve().parents[1]
TESTS_DIR = REPO / "tests"

VERDICTS = ("supported", "refuted", "inconclusive")


# ============================================================================ verdict rules

@dataclass
class Part:
    """One statistic of a claim, its interval, the rule applied and the outcome."""

    name: str
    point: float
    low: float
    high: float
    rule: str
    verdict: str
    n: str = ""


def _finite(*xs) -> bool:
    return all(x is not None and np.isfinite(x) for x in xs)


def rule_greater(name: str, point: float, low: float, high: float, threshold: float, n: str = "") -> Part:
    """Effect ``s > threshold``: supported if lo > t, refuted if hi < t, else inconclusive."""
    if not _finite(low, high):
        v = "inconclusive"
    else:
        v = "supported" if low > threshold else "refuted" if high < threshold else "inconclusive"
    return Part(name, point, low, high, f"> {threshold:g}", v, n)


def rule_less(name: str, point: float, low: float, high: float, threshold: float, n: str = "") -> Part:
    """Effect ``s < threshold``: supported if hi < t, refuted if lo > t, else inconclusive."""
    if not _finite(low, high):
        v = "inconclusive"
    else:
        v = "supported" if high < threshold else "refuted" if low > threshold else "inconclusive"
    return Part(name, point, low, high, f"< {threshold:g}", v, n)


def rule_null(name: str, point: float, low: float, high: float, tol: float, n: str = "") -> Part:
    """Null ``s = 0``: refuted if the interval excludes 0, supported if it lies in [-tol, tol]."""
    if not _finite(low, high):
        v = "inconclusive"
    elif low > 0 or high < 0:
        v = "refuted"
    else:
        v = "supported" if (low >= -tol and high <= tol) else "inconclusive"
    return Part(name, point, low, high, f"= 0 (+-{tol:g})", v, n)


def rule_exact(name: str, value: float, tol: float = EXACT_ZERO, n: str = "") -> Part:
    """An identity: supported if |value| <= tol, refuted otherwise (no interval: it is exact)."""
    v = "inconclusive" if not _finite(value) else "supported" if abs(value) <= tol else "refuted"
    return Part(name, value, value, value, f"|.| <= {tol:g}", v, n)


def combine(parts: list[Part]) -> str:
    if not parts:
        return "inconclusive"
    if any(p.verdict == "refuted" for p in parts):
        return "refuted"
    if all(p.verdict == "supported" for p in parts):
        return "supported"
    return "inconclusive"


@dataclass
class Verdict:
    claim: str
    verdict: str
    statistic: str = ""
    point: float = float("nan")
    low: float = float("nan")
    high: float = float("nan")
    n: str = ""
    parts: list[Part] = field(default_factory=list)
    note: str = ""
    not_run: str | None = None  # reason, when the evidence is missing
    figure: str | None = None

    @property
    def label(self) -> str:
        if self.not_run:
            return f"inconclusive — not run: {self.not_run}"
        return self.verdict


def verdict_from(claim: str, parts: list[Part], primary: int = 0, note: str = "", override: str | None = None) -> Verdict:
    p = parts[primary]
    return Verdict(claim, override or combine(parts), p.name, p.point, p.low, p.high, p.n, parts, note)


class NotRun(Exception):
    """Evidence missing: the claim is inconclusive - not run: <reason>."""


# ============================================================================ bootstrap helpers

def _interval(reps: np.ndarray) -> tuple[float, float]:
    return percentile_interval(reps, CONFIDENCE)


def paired_bootstrap(arrays: dict[str, np.ndarray], stat: Callable[[dict[str, np.ndarray]], np.ndarray],
                     reps: int = REPS, seed: int = SEED) -> tuple[float, float, float]:
    """Statistic of equally long per-batch arrays, resampling the *same* batch indices for all
    (common random numbers). ``stat`` maps ``{name: [reps, n]}`` to ``[reps]``."""
    n = {len(a) for a in arrays.values()}
    if len(n) != 1:
        raise ValueError(f"paired arrays must have equal lengths, got {sorted(n)}")
    m = n.pop()
    point = float(stat({k: np.asarray(a, float)[None, :] for k, a in arrays.items()})[0])
    idx = np.random.default_rng(seed).integers(0, m, size=(reps, m))
    r = stat({k: np.asarray(a, float)[idx] for k, a in arrays.items()})
    return (point, *_interval(r))


def group_bootstrap(groups: dict[str, np.ndarray], stat: Callable[[dict[str, np.ndarray]], np.ndarray],
                    reps: int = REPS, seed: int = SEED) -> tuple[float, float, float]:
    """Statistic of independent groups (e.g. seeds of two configs), each resampled on its own."""
    rng = np.random.default_rng(seed)
    groups = {k: np.asarray(v, float)[np.isfinite(np.asarray(v, float))] for k, v in groups.items()}
    if any(v.size < 2 for v in groups.values()):  # one value gives a zero-width interval: no evidence of spread
        raise NotRun("needs at least 2 seeds per group, got " + ", ".join(f"{k}: {v.size}" for k, v in groups.items()))
    point = float(stat({k: v[None, :] for k, v in groups.items()})[0])
    r = stat({k: v[rng.integers(0, v.size, size=(reps, v.size))] for k, v in groups.items()})
    return (point, *_interval(r))


def _mean(x):
    return x.mean(axis=-1)


# ============================================================================ experiments

# Experiment, EXPERIMENTS, Point, the sweeps (expanded by Hydra) and lm_unavailable live in
# harness.experiments, which runs them; here they only say where the evidence lies.

def sweep_params(name: str, quick: bool) -> dict[str, str]:
    """The sweep of experiment ``name`` as run (``--quick``: with its replacements)."""
    try:
        return _sweep_params(name, quick)
    except NotComposed as exc:
        raise NotRun(str(exc)) from None


def compose_points(name: str, root: Path, quick: bool) -> list[Point]:
    """Every config of experiment ``name`` with ``results_dir=root/name`` and its run directories."""
    try:
        return _compose_points(name, root, quick)
    except NotComposed as exc:
        raise NotRun(str(exc)) from None


# ============================================================================ loading evidence

@dataclass
class ExpData:
    """Everything one experiment produced in DIR, restricted to its expected run directories."""

    name: str
    runs: pd.DataFrame  # run_dir, status, reason, point (overrides)
    probe: pd.DataFrame
    batches: pd.DataFrame
    metrics: pd.DataFrame

    def finished(self) -> pd.DataFrame:
        return self.runs[self.runs.status.isin(FINISHED)]

    def left_out(self) -> list[dict]:
        """Run directories that exist (or failed to compose) but are not evidence, with why."""
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


_CFG_COLUMNS = {"epochs": ("epochs",), "ent_coef": ("ent_coef",), "loss_agg": ("loss_agg",),
                "cfg_clip_eps": ("clip_eps",), "cfg_group_size": ("group_size",), "cfg_kl_beta": ("kl", "beta"),
                "cfg_estimator": ("estimator",), "mode": ("mode",), "std_normalize": ("std_normalize",)}


def _cfg_values(cfg) -> dict:
    out = {}
    for col, keys in _CFG_COLUMNS.items():
        node = cfg
        for k in keys:
            node = node.get(k) if node is not None and k in node else None
        out[col] = node
    return out


def _read(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - ArrowInvalid, OSError...: any means unreadable
        raise _Unreadable(f"unreadable {path.name} ({type(exc).__name__}: {exc})".splitlines()[0]) from None


class _Unreadable(Exception):
    pass


def load_points(name: str, points: list[Point]) -> ExpData:
    """The evidence of experiment ``name``: runs (one row per expected run directory, with
    status and reason) and the tables of the finished ones (:mod:`harness.io.finished`).
    Statuses: completed | diverged (evidence), incomplete (no summary.json), failed (or any
    other status a summary records), corrupt (a file unreadable or disagreeing), not probed,
    non-finite (±inf score), missing (never run), error (config did not compose)."""
    runs, probes, batches, metrics = [], [], [], []
    for p in points:
        if p.error and not p.run_dirs:
            runs.append({"run_dir": None, "status": "error", "reason": p.error, "point": " ".join(p.overrides[3:])})
            continue
        for d in p.run_dirs:
            point = " ".join(p.overrides[3:])
            if not d.exists():
                status, reason = ("error", p.error) if p.error else ("missing", None)
                runs.append({"run_dir": str(d), "status": status, "reason": reason, "point": point})
                continue
            check = check_run(d)
            if check.finished:
                status, reason = check.status, None
                try:
                    reason = json.loads((d / "summary.json").read_text()).get("reason")
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
                extra = {"run_dir": str(d), **_cfg_values(p.cfg)}
                try:
                    for f in ("probe.parquet", "probe_batches.parquet"):
                        if (d / f).is_file():
                            tables[f] = _read(d / f).assign(**extra)
                    if (d / "metrics.parquet").is_file() and not (d / "probe.parquet").is_file():
                        m = _read(d / "metrics.parquet")
                        bad = nonfinite_score(m)
                        if bad is not None:
                            status, reason = "non-finite", bad
                        elif len(m):
                            tables["metrics"] = m.assign(status=status, **extra)
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
    b = cat(batches)
    pr = cat(probes)
    if len(b) and len(pr):  # per-batch rows get the probe's knobs (lambda, critic noise, ...)
        knobs = ["run_dir", "gae_lambda", "critic_noise", "group_size", "proposal_shift", "kl_estimator",
                 "negative_control", "batch_size", "is_weight_m2", "target"]
        k = pr[pr.scope == "all"][[c for c in knobs if c in pr.columns]]
        b = b.merge(k, on="run_dir", how="left")
    return ExpData(name, pd.DataFrame(runs), pr, b, cat(metrics))


def require(data: ExpData, min_runs: int = 1) -> None:
    """NotRun with the most telling reason when an experiment has too few finished runs."""
    if data.runs.empty:
        raise NotRun(f"experiment {data.name} has no configs")
    done = data.finished()
    if len(done) >= min_runs:
        return
    bad = data.runs[~data.runs.status.isin(FINISHED)]
    st = bad.status.value_counts().to_dict()
    reasons = [r for r in bad.reason.dropna().unique()][:1]
    why = f"{data.name}: " + ", ".join(f"{v} {k}" for k, v in st.items())
    if reasons:
        why += f" ({reasons[0]})"
    if set(st) <= {"missing"}:
        why += " (run them: python -m harness.experiments claims DIR [--quick])"
    raise NotRun(why)


def _sel(df: pd.DataFrame, **kw) -> pd.DataFrame:
    out = df
    for k, v in kw.items():
        if k not in out.columns:
            raise NotRun(f"column {k} missing from the evidence")
        if isinstance(v, float):
            out = out[np.isclose(out[k].astype(float), v)]
        else:
            out = out[out[k] == v]
    return out


def probe_row(data: ExpData, scope: str = "all", **kw) -> pd.Series:
    rows = _sel(data.probe, scope=scope, **kw) if len(data.probe) else pd.DataFrame()
    if rows.empty:
        raise NotRun(f"{data.name}: no probe row for {kw}")
    return rows.sort_values("seed").iloc[0]


def batch_values(data: ExpData, column: str, scope: str = "all", **kw) -> pd.Series:
    """Per-batch values indexed by (seed, batch), for pairing across configs."""
    rows = _sel(data.batches, scope=scope, **kw) if len(data.batches) else pd.DataFrame()
    if rows.empty:
        raise NotRun(f"{data.name}: no per-batch probe data for {kw}")
    return rows.set_index(["seed", "batch"])[column].sort_index()


def paired_ratio(num: pd.Series, den: pd.Series) -> tuple[float, float, float, int]:
    """mean(num) / mean(den) on batches present in both (same seed and batch index: the same samples)."""
    j = pd.concat([num.rename("a"), den.rename("b")], axis=1, join="inner")
    if j.empty:
        raise NotRun("no common batches to pair")
    pt, lo, hi = paired_bootstrap({"a": j.a.to_numpy(), "b": j.b.to_numpy()}, lambda d: _mean(d["a"]) / _mean(d["b"]))
    return pt, lo, hi, len(j)


def bias_part(name: str, row: pd.Series, null: bool) -> Part:
    n = f"{int(row['batches'])} batches"
    args = (name, float(row["rel_bias_sq"]), float(row["rel_bias_sq_low"]), float(row["rel_bias_sq_high"]))
    return rule_null(*args, BIAS_TOL_SQ, n) if null else rule_greater(*args, 0.0, n)


# ============================================================================ claims

@dataclass(frozen=True)
class Claim:
    id: str
    text: str
    source: str
    rule: str = ""
    evaluate: Callable[[dict[str, ExpData]], Verdict] | None = None
    experiments: tuple[str, ...] = ()  # harness.experiments.CLAIM_EXPERIMENTS
    tests: tuple[str, ...] = ()  # pytest -k prefixes (exact claims; harness.experiments.EXACT_TESTS)
    test_files: tuple[str, ...] = ()

    @property
    def exact(self) -> bool:
        return bool(self.tests)


# ---------------------------------------------------------------- toy probes

def eval_c3(d: dict[str, ExpData]) -> Verdict:
    e = d["claim_c3"]
    require(e, 2)
    rf = probe_row(e, estimator="reinforce", negative_control=False)
    bl = probe_row(e, estimator="baseline", negative_control=False)
    ratio, lo, hi, n = paired_ratio(batch_values(e, "dev_sq", run_dir=bl.run_dir),
                                    batch_values(e, "dev_sq", run_dir=rf.run_dir))
    parts = [rule_less("total-variance ratio baseline / REINFORCE (paired)", ratio, lo, hi, 1.0, f"{n} batches"),
             bias_part("baseline: |E g - grad J|^2 / |grad J|^2", bl, null=True)]
    override = None
    note = (f"critic fitted to the frozen policy: rmse vs V^pi {bl.critic_rmse:.3f}. REINFORCE (reference, not "
            f"judged): relative squared bias {rf.rel_bias_sq:.4f} [{rf.rel_bias_sq_low:.4f}, {rf.rel_bias_sq_high:.4f}].")
    try:
        ctrl = probe_row(e, estimator="reinforce", negative_control=True)
        power = bias_part("negative control (action-dependent baseline) bias detected", ctrl, null=False)
        parts.append(power)
        if power.verdict != "supported":
            override = "inconclusive"
            note += " The probe did not detect the deliberately biased baseline: not enough power to judge bias."
    except NotRun:
        note += " Negative control not run."
    dc = d.get("claim_c3_control")
    try:
        if dc is None:
            raise NotRun("claim_c3_control was not composed")
        require(dc, 2)
        crf = probe_row(dc, estimator="reinforce")
        cbl = probe_row(dc, estimator="baseline")
        r2, l2, h2, n2 = paired_ratio(batch_values(dc, "dev_sq", run_dir=cbl.run_dir),
                                      batch_values(dc, "dev_sq", run_dir=crf.run_dir))
        parts.insert(1, rule_less("CartPole: total-variance ratio baseline / REINFORCE (paired)", r2, l2, h2, 1.0,
                                  f"{n2} batches"))
        note += (f" CartPole (vs a {int(cbl.reference_batches)}-batch REINFORCE reference, gamma=1): baseline "
                 f"relative squared bias {cbl.rel_bias_sq:.4f} [{cbl.rel_bias_sq_low:.4f}, {cbl.rel_bias_sq_high:.4f}]"
                 f" (reported, not judged), critic explained variance {cbl.critic_ev:.2f}.")
    except NotRun as exc:
        note += f" Control-task part not run: {exc}."
    return verdict_from("C3", parts, note=note, override=override if combine(parts) != "refuted" else None)


def eval_c4(d):
    e = d["claim_c4"]
    require(e, 3)
    rl, gr, dr = (probe_row(e, estimator=x) for x in ("rloo", "grpo", "dr_grpo"))
    parts = [bias_part("RLOO: |E g - grad J|^2 / |grad J|^2", rl, null=True),
             bias_part("GRPO (std): relative squared bias", gr, null=False),
             bias_part("GRPO without std (dr_grpo): relative squared bias", dr, null=False)]
    note = (f"Weight along grad J (1 = unbiased scale): RLOO {rl.weight:.3f}, GRPO {gr.weight:.3f}, "
            f"dr_grpo {dr.weight:.3f} (theory (k-1)/k = {(rl.group_size - 1) / rl.group_size:.3f}); "
            f"cos(E g, grad J): GRPO {gr.cos_mean:.3f}, dr_grpo {dr.cos_mean:.3f}. "
            "'A little' is reported, not judged: the size is in the interval.")
    return verdict_from("C4", parts, primary=1, note=note)


def _c5_rows(e, noise):
    lam0 = probe_row(e, gae_lambda=0.0, critic_noise=noise)
    lam1 = probe_row(e, gae_lambda=1.0, critic_noise=noise)
    return lam0, lam1


C5_NOISE = 0.3


def eval_c5(d):
    e = d["claim_c5"]
    require(e, 2)
    lam0, lam1 = _c5_rows(e, C5_NOISE)
    ratio, lo, hi, n = paired_ratio(batch_values(e, "dev_sq", run_dir=lam0.run_dir),
                                    batch_values(e, "dev_sq", run_dir=lam1.run_dir))
    parts = [rule_less(f"variance ratio lambda=0 / lambda=1 (critic noise {C5_NOISE})", ratio, lo, hi, 1.0,
                       f"{n} batches"),
             bias_part(f"lambda=1 bias (critic noise {C5_NOISE})", lam1, null=True),
             bias_part(f"lambda=0 bias (critic noise {C5_NOISE})", lam0, null=False)]
    note = (f"advantage MSE vs Q - V: lambda=0 {lam0.adv_mse:.3f}, lambda=1 {lam1.adv_mse:.3f}. "
            f"Critic rmse vs V^pi: {lam0.critic_rmse:.3f}.")
    return verdict_from("C5", parts, note=note)


def eval_c6(d):
    e = d["claim_c5"]
    require(e, 2)
    lam0, lam1 = _c5_rows(e, C5_NOISE)
    ratio, lo, hi, n = paired_ratio(batch_values(e, "dev_sq", run_dir=lam1.run_dir),
                                    batch_values(e, "dev_sq", run_dir=lam0.run_dir))
    parts = [rule_less(f"variance ratio lambda=1 / lambda=0 (critic noise {C5_NOISE})", ratio, lo, hi, 1.0,
                       f"{n} batches")]
    return verdict_from("C6", parts, note="Judged on C5's runs (claim_c5).")


def eval_c13(d):
    e = d["claim_c13"]
    require(e, 2)
    rows = _sel(e.probe, scope="all").sort_values("proposal_shift")
    if rows.empty:
        raise NotRun("claim_c13: no probe rows")
    base, far = rows.iloc[0], rows.iloc[-1]
    if base.proposal_shift != 0.0:
        raise NotRun("claim_c13: the q = p run (shift 0) is missing")
    ratio, lo, hi, n = paired_ratio(batch_values(e, "dev_sq", run_dir=far.run_dir),
                                    batch_values(e, "dev_sq", run_dir=base.run_dir))
    parts = [rule_greater(f"variance ratio shift {far.proposal_shift:g} / q = p (E_q w^2 = {far.is_weight_m2:.2f})",
                          ratio, lo, hi, 1.0, f"{n} batches")]
    for r in rows.itertuples():
        parts.append(bias_part(f"gradient bias at shift {r.proposal_shift:g}", pd.Series(r._asdict()), null=True))
    order = np.argsort(rows.is_weight_m2.to_numpy())
    mono = bool(np.all(np.diff(rows.total_var.to_numpy()[order]) > 0))
    note = ("E_q[w^2] by shift: " + ", ".join(f"{s:g}: {m:.2f}" for s, m in zip(rows.proposal_shift, rows.is_weight_m2))
            + f"; variance increasing in E_q[w^2] across the grid: {mono}.")
    return verdict_from("C13", parts, note=note)


def eval_c14(d):
    e = d["claim_c14"]
    require(e, 2)
    free = _sel(e.probe, scope="all")
    free = free[free.estimator.isin(["grpo", "rloo", "remax"])]
    critic = _sel(e.probe, scope="all")
    critic = critic[critic.estimator.isin(["ppo_gae", "a2c"])]
    if free.empty or critic.empty:
        raise NotRun("claim_c14: needs critic-free and critic-based probes")
    parts = [rule_exact("max within-response advantage std, critic-free (" + ", ".join(free.estimator) + ")",
                        float(free.adv_within_std.max()), n=f"{int(free.batches.sum())} batches")]
    for r in critic.itertuples():
        parts.append(rule_greater(f"{r.estimator}: mean within-response advantage std", r.adv_within_std,
                                  r.adv_within_std_low, r.adv_within_std_high, 0.0, f"{r.batches} batches"))
    return verdict_from("C14", parts, primary=1, note="Toy task (3 tokens per response); tabular critics fitted to "
                                                      "the frozen policy.")


C17_EXTREME, C17_MIDDLE = ("prompt0", "prompt2"), "prompt1"  # p = 3/64, 61/64 and 1/2 in the mixed preset


def eval_c17(d):
    e = d["claim_c17"]
    require(e, 2)
    arrays = {}
    for std in (True, False):
        r = probe_row(e, std_normalize=std)
        for sc in (*C17_EXTREME, C17_MIDDLE):
            arrays[f"{std}_{sc}"] = batch_values(e, "err_proj", scope=sc, run_dir=r.run_dir)
    j = pd.concat(arrays, axis=1, join="inner")

    def up(dd, std):  # mean weight of the extreme prompts / weight of the middle prompt
        w = {sc: 1.0 + _mean(dd[f"{std}_{sc}"]) for sc in (*C17_EXTREME, C17_MIDDLE)}
        return (w[C17_EXTREME[0]] + w[C17_EXTREME[1]]) / 2 / w[C17_MIDDLE]

    pt, lo, hi = paired_bootstrap({k: j[k].to_numpy() for k in j.columns}, lambda dd: up(dd, True) / up(dd, False))
    parts = [rule_greater("relative up-weighting of p~0/p~1 prompts vs p=1/2, std / no std (paired)", pt, lo, hi,
                          1.0, f"{len(j)} batches")]
    rs, rn = probe_row(e, std_normalize=True), probe_row(e, std_normalize=False)
    ws = {sc: float(probe_row(e, scope=sc, std_normalize=True).weight) for sc in (*C17_EXTREME, C17_MIDDLE)}
    wn = {sc: float(probe_row(e, scope=sc, std_normalize=False).weight) for sc in (*C17_EXTREME, C17_MIDDLE)}
    note = ("per-prompt gradient weight (p=0.05, 0.95 | 0.5): with std " + ", ".join(f"{ws[s]:.2f}" for s in C17_EXTREME)
            + f" | {ws[C17_MIDDLE]:.2f}; without " + ", ".join(f"{wn[s]:.2f}" for s in C17_EXTREME)
            + f" | {wn[C17_MIDDLE]:.2f}. cos(E g, grad J): with std {rs.cos_mean:.3f}, without {rn.cos_mean:.3f};"
            f" per-batch cos: {rs.cos:.3f} vs {rn.cos:.3f}.")
    return verdict_from("C17", parts, note=note)


def eval_c22(d):
    e = d["claim_c22"]
    require(e, 3)
    k1, k2, k3 = (probe_row(e, kl_estimator=k) for k in ("k1", "k2", "k3"))
    kl = float(k3.value_true)
    v1 = batch_values(e, "value_est", run_dir=k1.run_dir)
    v3 = batch_values(e, "value_est", run_dir=k3.run_dir)
    j = pd.concat([v3.rename("a"), v1.rename("b")], axis=1, join="inner")
    pt, lo, hi = paired_bootstrap({"a": j.a.to_numpy(), "b": j.b.to_numpy()},
                                  lambda dd: dd["a"].var(axis=-1) / dd["b"].var(axis=-1))
    n = f"{len(j)} batches"
    parts = [rule_less("variance ratio of the KL value estimate, k3 / k1 (paired)", pt, lo, hi, 1.0, n),
             rule_null("k3 value bias / KL", k3.value_bias / kl, k3.value_bias_low / kl, k3.value_bias_high / kl,
                       0.05, n),
             bias_part("k3 in the loss: |E grad - grad KL|^2 / |grad KL|^2", k3, null=False)]
    note = (f"exact KL(pi||ref) = {kl:.4f}; value bias / KL: k1 {k1.value_bias / kl:+.3f}, "
            f"k2 {k2.value_bias / kl:+.3f}, k3 {k3.value_bias / kl:+.3f}; gradient relative squared bias: "
            f"k1 {k1.rel_bias_sq:.3f}, k2 {k2.rel_bias_sq:.3f}, k3 {k3.rel_bias_sq:.3f}.")
    return verdict_from("C22", parts, note=note)


# ---------------------------------------------------------------- toy training

def _per_run(m: pd.DataFrame, fn: Callable[[pd.DataFrame], float], by: str) -> pd.DataFrame:
    rows = []
    for (run_dir, seed), g in m.groupby(["run_dir", "seed"]):
        g = g.sort_values("iteration")
        rows.append({"run_dir": run_dir, "seed": seed, by: g[by].iloc[0], "value": fn(g)})
    return pd.DataFrame(rows)


def eval_c18(d):
    e = d["claim_c18"]
    require(e, 2)
    m = e.metrics
    growth = _per_run(m, lambda g: float(g.wrong_len.iloc[-10:].mean() - g.wrong_len.iloc[0]), "loss_agg")
    a = growth[growth.loss_agg == "seq_mean_token_mean"].value.to_numpy()
    b = growth[growth.loss_agg == "seq_mean_token_sum_norm"].value.to_numpy()
    if not a.size or not b.size:
        raise NotRun("claim_c18: needs loss_agg seq_mean_token_mean and seq_mean_token_sum_norm runs")
    pt, lo, hi = group_bootstrap({"a": a, "b": b}, lambda g: _mean(g["a"]) - _mean(g["b"]))
    pb, lb, hb = group_bootstrap({"b": b}, lambda g: _mean(g["b"]))
    parts = [rule_greater("growth of E[len | wrong]: seq_mean_token_mean - seq_mean_token_sum_norm (tokens)",
                          pt, lo, hi, 0.0, f"{a.size}+{b.size} seeds"),
             rule_null("growth of E[len | wrong] with seq_mean_token_sum_norm (tokens)", pb, lb, hb, 0.1,
                       f"{b.size} seeds")]
    means = growth.groupby("loss_agg").value.mean()
    note = "mean growth by loss_agg: " + ", ".join(f"{k} {v:+.3f}" for k, v in means.items()) + \
        " (exact expected length of wrong responses, last 10 iterations minus the first)."
    return verdict_from("C18", parts, note=note)


def eval_c20(d):
    e = d["claim_c20"]
    require(e, 2)
    ks = sorted(int(k) for k in e.probe.group_size.dropna().unique()) if len(e.probe) else []
    if len(ks) < 2:
        raise NotRun("claim_c20: needs probes for at least two group sizes")
    lo_k, hi_k = ks[0], ks[-1]
    dv = {k: _sel(e.batches, scope="all", group_size=k)["dev_sq"].to_numpy() for k in (lo_k, hi_k)}
    pt, lo, hi = group_bootstrap({"a": dv[hi_k], "b": dv[lo_k]}, lambda g: _mean(g["a"]) / _mean(g["b"]))
    parts = [rule_less(f"gradient variance ratio k={hi_k} / k={lo_k} (equal samples)", pt, lo, hi, 1.0,
                       f"{dv[hi_k].size}+{dv[lo_k].size} batches")]
    m = e.metrics
    if len(m):
        fin = _per_run(m, lambda g: float(g.eval_return.iloc[-10:].mean()), "group_size")
        a = fin[fin.group_size == hi_k].value.to_numpy()
        b = fin[fin.group_size == lo_k].value.to_numpy()
        if a.size and b.size:
            p2 = group_bootstrap({"a": a, "b": b}, lambda g: _mean(g["a"]) - _mean(g["b"]))
            parts.append(rule_greater(f"final exact J, k={hi_k} - k={lo_k}", *p2, 0.0, f"{a.size}+{b.size} seeds"))
        else:
            raise NotRun("claim_c20: training runs for the extreme group sizes are missing")
    else:
        raise NotRun("claim_c20: no training runs (mode=train)")
    return verdict_from("C20", parts)


# ---------------------------------------------------------------- control

def _control_runs(e: ExpData, last_n: int = 5) -> pd.DataFrame:
    m = e.metrics.copy()
    if m.empty:
        raise NotRun(f"{e.name}: no training metrics")
    for c in ("epochs", "ent_coef", "cfg_clip_eps"):
        if c in m.columns:
            m[c] = m[c].astype(float)
    runs = run_table(m, last_n=last_n)
    keys = m.groupby(["run_dir", "seed"]).agg(
        epochs=("epochs", "first"), ent_coef=("ent_coef", "first"), cfg_clip_eps=("cfg_clip_eps", "first"),
        mean_kl=("approx_kl", "mean"),
        entropy_first_half=("entropy", lambda s: float(s.iloc[: max(1, len(s) // 2)].mean()))).reset_index()
    return runs.drop(columns=["epochs", "ent_coef", "cfg_clip_eps"], errors="ignore").merge(keys, on=["run_dir", "seed"])


def eval_c8(d):
    e = d["claim_c8"]
    require(e, 2)
    r = _control_runs(e)
    ep = r.epochs.max()
    clip = r[(r.epochs == ep) & np.isclose(r.cfg_clip_eps.fillna(-1), 0.2)]
    none = r[(r.epochs == ep) & r.cfg_clip_eps.isna()]
    if clip.empty or none.empty:
        raise NotRun("claim_c8: needs clip_eps=0.2 and clip_eps=null runs at the largest epochs")
    p1 = group_bootstrap({"a": none.mean_kl, "b": clip.mean_kl}, lambda g: _mean(g["a"]) / _mean(g["b"]))
    p2 = group_bootstrap({"a": clip.score, "b": none.score}, lambda g: _mean(g["a"]) - _mean(g["b"]))
    n = f"{len(none)}+{len(clip)} seeds"
    parts = [rule_greater(f"mean KL to the pre-update policy, no clip / clip 0.2 (epochs={ep:g})", *p1, 1.0, n),
             rule_greater(f"final return, clip 0.2 - no clip (epochs={ep:g})", *p2, 0.0, n)]
    col = r.groupby([r.cfg_clip_eps.fillna(-1), "epochs"]).collapsed.mean()
    note = "collapse rate by (clip_eps, epochs): " + ", ".join(
        f"({'none' if c < 0 else f'{c:g}'}, {int(k)}): {v:.2f}" for (c, k), v in col.items())
    return verdict_from("C8", parts, note=note)


def eval_c9(d):
    e = d["claim_c9"]
    require(e, 2)
    r = _control_runs(e)
    ppo = r[r.estimator == "ppo_gae"].auc.to_numpy()
    if not ppo.size:
        raise NotRun("claim_c9: no ppo_gae runs")
    parts = []
    for other in ("reinforce", "baseline", "a2c"):
        o = r[r.estimator == other].auc.to_numpy()
        if not o.size:
            continue

        def stat(g):
            return np.array([iqm(row) for row in g["a"]]) - np.array([iqm(row) for row in g["b"]])

        p = group_bootstrap({"a": ppo, "b": o}, stat, reps=1000)
        parts.append(rule_greater(f"IQM area under the learning curve, ppo_gae - {other}", *p, 0.0,
                                  f"{ppo.size}+{o.size} seeds"))
    if not parts:
        raise NotRun("claim_c9: no vanilla-PG runs to compare with")
    weakest = int(np.argmin([p.low for p in parts]))
    return verdict_from("C9", parts, primary=weakest, note="AUC: mean evaluation return over the env-step budget.")


def eval_c11(d):
    e = d["claim_c11"]
    require(e, 2)
    r = _control_runs(e)
    zero, pos = r[r.ent_coef == 0], r[r.ent_coef == r.ent_coef.max()]
    if zero.empty or pos.empty or not r.ent_coef.max() > 0:
        raise NotRun("claim_c11: needs ent_coef = 0 and > 0 runs")
    p = group_bootstrap({"a": pos.entropy_first_half, "b": zero.entropy_first_half},
                        lambda g: _mean(g["a"]) - _mean(g["b"]))
    parts = [rule_greater(f"policy entropy over the first half, ent_coef {pos.ent_coef.iloc[0]:g} - 0", *p, 0.0,
                          f"{len(pos)}+{len(zero)} seeds")]
    q = group_bootstrap({"a": pos.score, "b": zero.score}, lambda g: _mean(g["a"]) - _mean(g["b"]))
    by = r.groupby("ent_coef").entropy_first_half.mean()
    note = (f"final return difference (largest ent_coef minus 0): {q[0]:+.1f} [{q[1]:+.1f}, {q[2]:+.1f}] (reported, "
            "not judged); mean first-half entropy by ent_coef: " + ", ".join(f"{k:g}: {v:.3f}" for k, v in by.items()))
    return verdict_from("C11", parts, note=note)


# ---------------------------------------------------------------- LM

def _lm_runs(e: ExpData) -> pd.DataFrame:
    m = e.metrics
    if m.empty:
        raise NotRun(f"{e.name}: no LM metrics")
    rows = []
    for (run_dir, seed), g in m.groupby(["run_dir", "seed"]):
        g = g.sort_values("iteration")
        k = max(1, min(3, len(g) // 3))
        rows.append({"run_dir": run_dir, "seed": seed, "estimator": g.estimator.iloc[0],
                     "kl_beta": float(g.kl_beta.iloc[0]), "epochs": g.epochs.iloc[0], "clip_eps": g.cfg_clip_eps.iloc[0],
                     "reward0": g.reward.iloc[:k].mean(), "reward1": g.reward.iloc[-k:].mean(),
                     "gold0": g.gold_reward.iloc[:k].mean(), "gold1": g.gold_reward.iloc[-k:].mean(),
                     "kl1": g.kl_ref.iloc[-k:].mean(), "clip_frac": g.clip_frac.mean(),
                     "peak_mem": g.peak_mem_mb.max() if "peak_mem_mb" in g else np.nan,
                     "wall": g.wall_time_s.max(), "curve": g[["kl_ref", "gold_reward"]].to_numpy()})
    return pd.DataFrame(rows)


def eval_c10(d):
    e = d["claim_c10"]
    require(e, 2)
    r = _lm_runs(e)
    betas = sorted(r.kl_beta.unique())
    b0, bmax = r[r.kl_beta == betas[0]], r[r.kl_beta == betas[-1]]
    if betas[0] != 0 or len(betas) < 2:
        raise NotRun("claim_c10: needs beta = 0 and beta > 0 runs")
    n0 = f"{len(b0)} seeds"
    p1 = group_bootstrap({"a": b0.reward1 - b0.reward0}, lambda g: _mean(g["a"]))
    p2 = group_bootstrap({"a": b0.gold1 - b0.gold0}, lambda g: _mean(g["a"]))
    p3 = group_bootstrap({"a": bmax.gold1 - bmax.gold0, "b": b0.gold1 - b0.gold0}, lambda g: _mean(g["a"]) - _mean(g["b"]))
    parts = [rule_less("beta=0: change of the gold score over training", *p2, 0.0, n0),
             rule_greater("beta=0: change of the proxy reward over training", *p1, 0.0, n0),
             rule_greater(f"gold change, beta={betas[-1]:g} - beta=0", *p3, 0.0, f"{len(bmax)}+{len(b0)} seeds")]
    note = "final KL to reference by beta: " + ", ".join(f"{b:g}: {r[r.kl_beta == b].kl1.mean():.2f}" for b in betas)
    return verdict_from("C10", parts, note=note)


def eval_c21(d):
    e = d["claim_c10"]
    require(e, 2)
    r = _lm_runs(e)
    b0, pos = r[r.kl_beta == 0], r[r.kl_beta > 0]
    if b0.empty or pos.empty:
        raise NotRun("claim_c10 runs: needs beta = 0 and beta > 0")
    # frontier of beta=0: gold against sqrt(KL), pooled over seeds; beta>0 points compared at equal sqrt(KL)
    pts = np.concatenate([c for c in b0.curve])
    order = np.argsort(pts[:, 0])
    x0, y0 = np.sqrt(np.clip(pts[order, 0], 0, None)), pts[order, 1]
    gaps = []
    for c in pos.curve:
        x = np.sqrt(np.clip(c[:, 0], 0, None))
        inside = (x >= x0.min()) & (x <= x0.max())
        if inside.any():
            gaps.append(float(np.mean(c[inside, 1] - np.interp(x[inside], x0, y0))))
    if not gaps:
        raise NotRun("claim_c10 runs: beta > 0 runs never reach the KL range of beta = 0")
    scale = float(np.nanstd(y0)) or 1.0
    p1 = group_bootstrap({"a": np.array(gaps) / scale}, lambda g: _mean(g["a"]))
    p2 = group_bootstrap({"a": pos.kl1, "b": b0.kl1}, lambda g: _mean(g["a"]) / _mean(g["b"]))
    parts = [rule_null("gold gap to the beta=0 frontier at equal sqrt(KL) (in gold std units)", *p1, 0.25,
                       f"{len(gaps)} runs"),
             rule_less("final KL, beta>0 / beta=0", *p2, 1.0, f"{len(pos)}+{len(b0)} seeds")]
    return verdict_from("C21", parts)


def eval_c15(d):
    e = d["claim_c15"]
    require(e, 2)
    r = _lm_runs(e)
    ppo = r[r.estimator == "ppo_gae"]
    if ppo.empty:
        raise NotRun("claim_c15: no ppo_gae runs")
    margin = 0.1 * abs(float((ppo.reward1 - ppo.reward0).mean())) or 0.05
    parts = []
    for other in ("rloo", "remax"):
        o = r[r.estimator == other]
        if o.empty:
            continue
        n = f"{len(o)}+{len(ppo)} seeds"
        p = group_bootstrap({"a": o.reward1, "b": ppo.reward1}, lambda g: _mean(g["a"]) - _mean(g["b"]))
        parts.append(rule_greater(f"final reward {other} - ppo_gae (non-inferiority margin {margin:.3f})", *p,
                                  -margin, n))
        for col, label in (("peak_mem", "peak memory"), ("wall", "wall time")):
            q = group_bootstrap({"a": o[col], "b": ppo[col]}, lambda g: _mean(g["a"]) / _mean(g["b"]))
            parts.append(rule_less(f"{label} {other} / ppo_gae", *q, 1.0, n))
    if not parts:
        raise NotRun("claim_c15: no rloo/remax runs")
    return verdict_from("C15", parts)


def eval_c19(d):
    e = d["claim_c19"]
    require(e, 2)
    r = _lm_runs(e)
    clipped = r[r.clip_eps.notna()]
    free = r[r.clip_eps.isna()]
    if clipped.empty or free.empty:
        raise NotRun("claim_c19: needs clipped and unclipped runs")
    p1 = group_bootstrap({"a": clipped.clip_frac}, lambda g: _mean(g["a"]))
    margin = 0.1 * abs(float((clipped.reward1 - clipped.reward0).mean())) or 0.05
    p2 = group_bootstrap({"a": free.reward1, "b": clipped.reward1}, lambda g: _mean(g["a"]) - _mean(g["b"]))
    parts = [rule_less("mean clip fraction with clipping (epochs 1-2)", *p1, 0.05, f"{len(clipped)} runs"),
             rule_null(f"final reward, no clip - clip (tolerance {margin:.3f})", *p2, margin,
                       f"{len(free)}+{len(clipped)} runs")]
    return verdict_from("C19", parts)


# ---------------------------------------------------------------- the table

_NULL = "null rule: refuted if the interval excludes 0, supported if it lies within the tolerance"
CLAIMS: list[Claim] = [
    Claim("C1", "Worked GAE example (values 0.5, 0.4, 0.8; terminal reward 1): deltas, lambda=1 and lambda=0 "
                "advantages and returns", "002", rule="exact: every listed test passes"),
    Claim("C2", "GAE(lambda=1) = MC advantage, GAE(lambda=0) = TD error; n-step with n=1 is TD, n>=T is MC",
          "002, 003", rule="exact: every listed test passes"),
    Claim("C3", "A state-dependent baseline leaves the expected gradient unchanged and lowers its variance", "002",
          "variance ratio baseline/REINFORCE (paired) < 1 (upper bound) on the toy task and on CartPole when "
          f"claim_c3_control ran; baseline's relative squared bias: {_NULL} {BIAS_TOL_SQ:g}; the negative "
          "control's bias must be detected (lower bound > 0), else inconclusive", eval_c3),
    Claim("C4", "RLOO's leave-one-out baseline adds no bias; GRPO's group mean and std add a little bias", "002",
          f"RLOO relative squared bias: {_NULL} {BIAS_TOL_SQ:g}; GRPO and dr_grpo relative squared "
          "bias > 0 (lower bound)", eval_c4),
    Claim("C5", "GAE lambda trades bias for variance: lambda=1 unbiased high variance, lambda=0 low variance biased "
                "with a wrong critic", "002, 003",
          f"variance ratio lambda0/lambda1 (critic noise {C5_NOISE}) < 1; lambda=1 bias: {_NULL} {BIAS_TOL_SQ:g}; "
          "lambda=0 bias > 0", eval_c5),
    Claim("C6", "(000) lambda=1 is low variance", "000",
          f"variance ratio lambda1/lambda0 (critic noise {C5_NOISE}) < 1 (C5's runs)", eval_c6),
    Claim("C7", "Clipped objective: zero gradient for A>0, r>1+eps and A<0, r<1-eps; not cut off for A<0, r>1+eps; "
                "a lower bound of the unclipped objective", "003", rule="exact: every listed test passes"),
    Claim("C8", "Clipping keeps updates stable: without it, several epochs move the policy far and performance "
                "collapses more often", "003, 000",
          "at the largest epochs: mean KL ratio no-clip/clip-0.2 > 1 and final return clip-0.2 minus no-clip > 0 "
          "(both lower bounds)", eval_c8),
    Claim("C9", "Several epochs per batch (PPO) are more sample-efficient than one update (vanilla PG)", "000",
          "IQM AUC difference ppo_gae - X > 0 for X in reinforce, baseline, a2c (all lower bounds "
          "> 0: supported; any upper bound < 0: refuted)", eval_c9),
    Claim("C10", "The KL penalty stops reward hacking: with beta=0 proxy reward rises while gold falls and KL grows",
          "003", "beta=0: gold change < 0 and proxy change > 0; gold change (largest beta) - "
                 "(beta=0) > 0", eval_c10),
    Claim("C11", "The entropy bonus keeps the action distribution from collapsing prematurely", "003",
          "policy entropy over the first half of training, largest ent_coef minus ent_coef=0, > 0", eval_c11),
    Claim("C12", "Teacher forcing gives every response token's log-probability in one pass, equal to sequential "
                 "decoding", "003", rule="exact: every listed test passes"),
    Claim("C13", "Importance-weighted estimates keep their mean but their variance grows as p/q departs from 1",
          "002", f"variance ratio (largest shift)/(q = p) > 1; gradient bias at every shift: {_NULL} "
                 f"{BIAS_TOL_SQ:g}", eval_c13),
    Claim("C14", "Critic-free methods give every token the same advantage; a learned critic spreads credit",
          "000, 002", f"critic-free within-response advantage std <= {EXACT_ZERO:g} (exact); "
                      "ppo_gae and a2c within-response std > 0", eval_c14),
    Claim("C15", "RLOO and ReMax reach PPO's reward on the LM task at lower memory and time", "002",
          "final reward X - ppo_gae > -10% of PPO's reward gain; peak memory and wall-time ratios X/ppo_gae < 1, "
          "X in rloo, remax", eval_c15),
    Claim("C16", "Group-mean-centred advantage times k/(k-1) equals RLOO exactly", "Dr. GRPO",
          rule="exact: every listed test passes"),
    Claim("C17", "Dividing by the group std up-weights prompts that are almost always right or wrong", "Dr. GRPO",
          "(mean weight of the p~0.05 and p~0.95 prompts / weight of p=0.5), with std over "
          "without, > 1 (paired)", eval_c17),
    Claim("C18", "Per-sequence 1/length averaging lets wrong answers grow longer; token-sum with a constant "
                 "normaliser does not", "Dr. GRPO",
          "growth of E[len|wrong], seq_mean_token_mean minus seq_mean_token_sum_norm, > 0; growth with "
          "seq_mean_token_sum_norm: null within 0.1 tokens", eval_c18),
    Claim("C19", "Clipping is rarely active in LM RL with 1-2 epochs (<5% of tokens); removing it costs little",
          "Back to Basics", "mean clip fraction < 0.05; final reward no-clip minus clip: null "
                            "within 10% of the reward gain", eval_c19),
    Claim("C20", "RLOO's gradient variance falls and final reward rises as k grows (equal samples)",
          "Back to Basics", "variance ratio k_max/k_min < 1 and final exact J k_max - k_min > 0",
          eval_c20),
    Claim("C21", "A KL penalty slows the climb along the gold-vs-KL curve but does not lift it", "Gao et al. 2022",
          "gold gap of beta>0 runs to the beta=0 frontier at equal sqrt(KL): null within 0.25 gold "
          "std; final KL ratio beta>0/beta=0 < 1", eval_c21),
    Claim("C22", "k1, k2, k3 differ in bias and variance: k3 unbiased low-variance value, biased gradient in the "
                 "loss", "Schulman; verl/TRL",
          "value variance ratio k3/k1 < 1; k3 value bias / KL: null within 0.05; k3 gradient relative squared "
          "bias > 0", eval_c22),
]
# what each claim needs run (its experiments, an exact claim's tests) is harness.experiments' table
CLAIMS = [replace(c, experiments=CLAIM_EXPERIMENTS.get(c.id, ()), tests=EXACT_TESTS.get(c.id, ((), ()))[0],
                  test_files=EXACT_TESTS.get(c.id, ((), ()))[1]) for c in CLAIMS]
CLAIMS_BY_ID = {c.id: c for c in CLAIMS}


# ============================================================================ exact tests

def exact_test_nodes(claim: Claim) -> tuple[list[str], str | None]:
    """Test files of an exact claim and the -k expression; files missing -> (files, None)."""
    files = []
    for pattern in claim.test_files:
        files += sorted(str(p.relative_to(REPO)) for p in TESTS_DIR.glob(pattern))
    return files, " or ".join(claim.tests)


def eval_exact(claim: Claim, record: dict | None) -> Verdict:
    files, expr = exact_test_nodes(claim)
    where = f"`pytest {' '.join(files) or 'tests/' + claim.test_files[0]} -k \"{expr}\"`"
    if record is None:
        v = Verdict(claim.id, "inconclusive", "tests " + where, not_run="tests not run here (python -m harness.experiments claims DIR runs them)")
        return v
    r = record.get("claims", {}).get(claim.id, {"nodes": [], "outcomes": []})
    nodes, outcomes = r["nodes"], r["outcomes"]
    if not nodes:
        return Verdict(claim.id, "inconclusive", "tests " + where,
                       not_run=f"no test matching {expr!r} was collected" + ("" if files else " (no test file yet)"))
    n_pass = sum(o == "passed" for o in outcomes)
    n_fail = sum(o == "failed" for o in outcomes)
    verdict = "refuted" if n_fail else "supported" if n_pass == len(outcomes) else "inconclusive"
    v = Verdict(claim.id, verdict, "tests passed", float(n_pass), float(n_pass), float(n_pass),
                f"{len(nodes)} tests", note="tests: " + ", ".join(f"`{n}` ({o})" for n, o in zip(nodes, outcomes)))
    return v


# ============================================================================ figures

def _figures(verdict: Verdict, data: dict[str, ExpData], out: Path) -> str | None:
    import matplotlib.pyplot as plt

    cid = verdict.claim
    exp = CLAIMS_BY_ID[cid].experiments
    if not exp or verdict.not_run:
        return None
    e = data[exp[0]]
    path = out / f"{cid.lower()}.png"
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    try:
        if len(e.probe):
            p = e.probe[e.probe.scope == "all"].copy()
            if cid in ("C5", "C6"):
                for noise, g in p.groupby("critic_noise"):
                    g = g.sort_values("gae_lambda")
                    axes[0].plot(g.gae_lambda, g.rel_total_var, "o-", label=f"critic noise {noise:g}")
                    axes[1].errorbar(g.gae_lambda, g.rel_bias_sq, yerr=[g.rel_bias_sq - g.rel_bias_sq_low,
                                                                         g.rel_bias_sq_high - g.rel_bias_sq],
                                     fmt="o-", capsize=3, label=f"critic noise {noise:g}")
                axes[0].set_xlabel("gae_lambda")
                axes[1].set_xlabel("gae_lambda")
                axes[0].legend()
            elif cid == "C13":
                g = p.sort_values("is_weight_m2")
                axes[0].plot(g.is_weight_m2, g.rel_total_var, "o-")
                axes[0].set_xlabel("E_q[w^2] (exact)")
                axes[1].errorbar(g.is_weight_m2, g.rel_bias_sq, yerr=[g.rel_bias_sq - g.rel_bias_sq_low,
                                                                       g.rel_bias_sq_high - g.rel_bias_sq],
                                 fmt="o", capsize=3)
                axes[1].set_xlabel("E_q[w^2] (exact)")
            elif cid == "C17":
                q = e.probe[e.probe.scope != "all"]
                for std, g in q.groupby("std_normalize"):
                    axes[0].errorbar(g.prompt_success, g.weight, yerr=[g.weight - g.weight_low, g.weight_high - g.weight],
                                     fmt="o", capsize=3, label=f"std_normalize={std}")
                axes[0].set_xlabel("prompt success probability")
                axes[0].set_ylabel("gradient weight <E g_x, grad J_x>/|grad J_x|^2")
                axes[0].legend()
                axes[1].bar([str(s) for s in p.std_normalize], p.cos_mean)
                axes[1].set_ylabel("cos(E g, grad J)")
            else:
                labels = p.label + p.apply(lambda r: "" if r.target != "policy_gradient" or cid not in ("C20",)
                                           else f" k={r.group_size}", axis=1)
                axes[0].bar(labels, p.rel_total_var)
                axes[0].set_ylabel("tr Var / |grad|^2")
                axes[1].errorbar(range(len(p)), p.rel_bias_sq, yerr=[p.rel_bias_sq - p.rel_bias_sq_low,
                                                                      p.rel_bias_sq_high - p.rel_bias_sq],
                                 fmt="o", capsize=3)
                axes[1].set_xticks(range(len(p)), labels)
                axes[1].axhline(0, color="grey", lw=0.8)
                for ax in axes:
                    plt.setp(ax.get_xticklabels(), rotation=25, ha="right", fontsize=7)
            if cid not in ("C17",):
                axes[0].set_ylabel("tr Var / |grad|^2")
                axes[1].set_ylabel("|E g - grad|^2 / |grad|^2 (95% CI)")
        elif len(e.metrics):
            m = e.metrics
            y1, y2, hue = {"C18": ("wrong_len", "eval_return", "loss_agg"), "C20": ("eval_return", "grad_cos", "group_size"),
                           "C8": ("eval_return", "approx_kl", "cfg_clip_eps"), "C9": ("eval_return", "entropy", "estimator"),
                           "C11": ("eval_return", "entropy", "ent_coef"), "C10": ("gold_reward", "reward", "kl_beta"),
                           "C21": ("gold_reward", "kl_ref", "kl_beta"), "C15": ("reward", "peak_mem_mb", "estimator"),
                           "C19": ("reward", "clip_frac", "cfg_clip_eps")}.get(cid, ("eval_return", "episode_return", "estimator"))
            x = "env_steps" if "env_steps" in m else "iteration"
            for ax, y in zip(axes, (y1, y2)):
                if y not in m:
                    continue
                for key, g in m.groupby(m[hue].astype(str)):
                    curve = g.groupby(x)[y].mean()
                    ax.plot(curve.index, curve.values, label=f"{hue}={key}")
                ax.set_xlabel(x)
                ax.set_ylabel(y)
            axes[0].legend(fontsize=7)
        else:
            plt.close(fig)
            return None
        fig.suptitle(f"{cid}: {verdict.label}", fontsize=9)
        fig.tight_layout()
        out.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        return str(path)
    except Exception as exc:  # a figure never sinks the report
        print(f"[claims] figure for {cid} failed: {exc}", file=sys.stderr)
        return None
    finally:
        plt.close(fig)


# ============================================================================ report

def _fmt(x: float) -> str:
    if x is None or not np.isfinite(x):
        return "—"
    a = abs(x)
    return f"{x:.3g}" if (a >= 1e-3 and a < 1e4) or a == 0 else f"{x:.2e}"


def _cell(text: str) -> str:
    """Markdown table cell: a literal | would end the cell."""
    return str(text).replace("|", "\\|")


def _ci(v: Verdict | Part) -> str:
    if not _finite(v.low, v.high) or (v.low == v.high):
        return "—"
    return f"[{_fmt(v.low)}, {_fmt(v.high)}]"


def evaluate_all(root: Path, quick: bool, only: set[str] | None = None,
                 progress: Callable[[str], None] = print) -> tuple[list[Verdict], dict[str, ExpData], dict]:
    """Verdicts from what lies in ``root`` (runs nothing: ``python -m harness.experiments claims``)."""
    claims = [c for c in CLAIMS if only is None or c.id in only]
    exp_names = []
    for c in claims:
        for x in c.experiments:
            if x not in exp_names:
                exp_names.append(x)
    order = {"toy": 0, "control": 1, "lm": 2}
    exp_names.sort(key=lambda x: order[EXPERIMENTS[x].family])
    skipped: dict[str, str] = {}
    tests_json = root / "exact_tests.json"
    points: dict[str, list[Point]] = {}
    for name in exp_names:
        ex = EXPERIMENTS[name]
        if quick and ex.quick_skip:
            skipped[name] = ex.quick_skip
            continue
        if ex.family == "lm":
            reason = lm_unavailable()
            if reason:
                skipped[name] = reason
                continue
        try:
            points[name] = compose_points(name, root, quick)
        except NotRun as exc:
            skipped[name] = str(exc)
            continue
        except Exception as exc:
            skipped[name] = f"cannot compose {name}: {type(exc).__name__}: {exc}".splitlines()[0]
            continue
    data = {name: load_points(name, pts) for name, pts in points.items()}
    record = json.loads(tests_json.read_text()) if tests_json.is_file() else None
    verdicts = []
    for c in claims:
        if c.exact:
            verdicts.append(eval_exact(c, record))
            continue
        missing = [x for x in c.experiments[:1] if x not in data]  # later experiments are optional parts
        if missing:
            verdicts.append(Verdict(c.id, "inconclusive", not_run=skipped.get(missing[0], f"{missing[0]} not composed")))
            continue
        try:
            verdicts.append(c.evaluate(data))
        except NotRun as exc:
            verdicts.append(Verdict(c.id, "inconclusive", not_run=str(exc)))
        except Exception as exc:  # an analysis error is reported, never turned into a verdict
            traceback.print_exc(file=sys.stderr)
            verdicts.append(Verdict(c.id, "inconclusive", not_run=f"analysis error: {type(exc).__name__}: {exc}"))
    return verdicts, data, {"skipped": skipped, "tests": record}


def write_report(root: Path, verdicts: list[Verdict], data: dict[str, ExpData], meta: dict, quick: bool,
                 wall_s: float) -> Path:
    fig_dir = root / "claims_figures"
    for v in verdicts:
        if not v.not_run:
            v.figure = _figures(v, data, fig_dir)
    lines = [f"# Claims report — {root}", "",
             f"Mode: **{'quick' if quick else 'full'}**"
             + (" (smaller budgets, wider intervals; LM claims skipped)" if quick else "")
             + f". Generated {time.strftime('%Y-%m-%d %H:%M:%S')} in {wall_s:.0f} s. Intervals are 95% bootstrap "
               "percentile intervals (paired over shared batches where two estimators saw the same samples).", "",
             "Verdict rules (fixed in `analysis/claims.py` before data is read): an effect `s > t` is *supported* "
             "if the interval's lower bound exceeds t, *refuted* if its upper bound is below t, else "
             "*inconclusive*; a null `s = 0` is *refuted* if the interval excludes 0, *supported* if it contains 0 "
             "and lies within the stated tolerance, else inconclusive. A claim with several parts is supported "
             "when all parts are, refuted when any is. Missing or failed runs give \"inconclusive — not run\".", "",
             "| id | claim | source | experiment | statistic | value | 95% interval | n | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for v in verdicts:
        c = CLAIMS_BY_ID[v.claim]
        exp = ", ".join(f"`{x}`" for x in c.experiments) if c.experiments else "unit tests"
        verdict = f"**{v.verdict}**" if not v.not_run else v.label
        value = _fmt(v.point) if not v.not_run and not c.exact else ("—" if v.not_run else f"{int(v.point)} passed")
        lines.append(f"| {c.id} | {_cell(c.text)} | {c.source} | {exp} | {_cell(v.statistic or '—')} | {value} | "
                     f"{_ci(v) if not c.exact else '—'} | {v.n or '—'} | {_cell(verdict)} |")
    left_out = [r for name in sorted(data) for r in data[name].left_out()]
    missing = sum(e.missing() for e in data.values())
    lines += ["", "## Runs left out", ""]
    if left_out:
        lines += [f"{len(left_out)} run director{'y' if len(left_out) == 1 else 'ies'} of the experiments are not "
                  "evidence (only finished runs are, by the harness's definition, `harness.io.finished`):", ""]
        lines += [f"- `{r['path']}`: {_cell(r['reason'])}" for r in left_out]
    else:
        lines.append("None.")
    if missing:
        lines += ["", f"{missing} run director{'y' if missing == 1 else 'ies'} not run yet (`python -m harness."
                      f"experiments claims {root}{' --quick' if quick else ''}` runs them)."]
    lines += ["", "## Details", ""]
    for v in verdicts:
        c = CLAIMS_BY_ID[v.claim]
        lines += [f"### {c.id} — {v.label}", "", f"*Claim ({c.source}):* {c.text}.", "",
                  f"*Rule:* {c.rule}.", ""]
        if v.parts:
            lines += ["| part | value | 95% interval | rule | n | outcome |", "| --- | --- | --- | --- | --- | --- |"]
            for p in v.parts:
                lines.append(f"| {_cell(p.name)} | {_fmt(p.point)} | {_ci(p)} | {_cell(p.rule)} | {p.n} | {p.verdict} |")
            lines.append("")
        if v.note:
            lines += [v.note, ""]
        if c.experiments and c.experiments[0] in data:
            e = data[c.experiments[0]]
            st = e.runs.status.value_counts().to_dict() if len(e.runs) else {}
            lines += [f"Runs of `{c.experiments[0]}` in this folder: " + ", ".join(f"{n} {s}" for s, n in st.items())
                      + f" (`python -m harness -m experiment={c.experiments[0]}`).", ""]
        if v.figure:
            lines += [f"![{c.id}]({Path(v.figure).relative_to(root).as_posix()})", ""]
    lines += ["## Experiments", "",
              "Each claim experiment is a Hydra sweep (`python -m harness -m experiment=NAME`); seeds, budgets and "
              "the fixed settings are in `conf/experiment/NAME.yaml`. Sweep parameters as run for this report"
              + (" (with the --quick replacements)" if quick else "") + ":", "",
              "| experiment | sweep | configs | runs |", "| --- | --- | --- | --- |"]
    for name in sorted(set(data) | set(meta.get("skipped", {})), key=lambda n: (int(n.split("_c")[1].split("_")[0]), n)):
        if name in data:
            e = data[name]
            st = ", ".join(f"{n} {s_}" for s_, n in e.runs.status.value_counts().items()) if len(e.runs) else "—"
            try:
                sweep = "; ".join(f"`{k}={v}`" for k, v in sweep_params(name, quick).items())
            except NotRun:
                sweep = "—"
            lines.append(f"| `{name}` | {sweep} | {e.runs.point.nunique() if len(e.runs) else 0} | {st} |")
        else:
            lines.append(f"| `{name}` | — | — | not run: {meta['skipped'][name]} |")
    text = "\n".join(lines) + "\n"
    out = root / "claims.md"
    atomic_write_text(out, text)
    atomic_write_json(root / "claims.json", {"mode": "quick" if quick else "full", "wall_s": wall_s, "verdicts": [
        {"claim": v.claim, "verdict": v.verdict, "label": v.label, "statistic": v.statistic, "point": v.point,
         "low": v.low, "high": v.high, "n": v.n, "not_run": v.not_run,
         "parts": [p.__dict__ for p in v.parts], "note": v.note} for v in verdicts],
        "left_out": left_out, "not_run_yet": missing})
    return out


@dataclass
class ClaimsResult:
    """What :func:`build_claims` wrote and judged; ``left_out``: runs that are not evidence
    (``{"experiment", "path", "status", "reason"}``), ``missing``: run directories never run."""

    out: Path
    verdicts: list[Verdict]
    left_out: list[dict]
    missing: int


def build_claims(root: str | Path, *, quick: bool = False, only: set[str] | None = None,
                 progress: Callable[[str], None] = print) -> ClaimsResult:
    """Judge the claims on what ``root`` holds; write claims.md, claims.json and the figures there."""
    root = Path(root).resolve()  # as harness.experiments wrote it (results_dir=<root>/<experiment>)
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    verdicts, data, meta = evaluate_all(root, quick=quick, only=only, progress=progress)
    out = write_report(root, verdicts, data, meta, quick, time.time() - t0)
    left_out = [r for name in sorted(data) for r in data[name].left_out()]
    return ClaimsResult(out, verdicts, left_out, sum(e.missing() for e in data.values()))


def build_claims_report(root: str | Path, *, quick: bool = False, only: set[str] | None = None,
                        progress: Callable[[str], None] = print) -> tuple[Path, list[Verdict]]:
    """:func:`build_claims`, returning ``(claims.md path, verdicts)``."""
    res = build_claims(root, quick=quick, only=only, progress=progress)
    return res.out, res.verdicts


def format_table(verdicts: list[Verdict]) -> str:
    rows = []
    for v in verdicts:
        stat = f"{_fmt(v.point)} {_ci(v)}" if not v.not_run and not CLAIMS_BY_ID[v.claim].exact else ""
        rows.append(f"  {v.claim:<4} {v.label[:70]:<70} {stat}")
    return "\n".join(rows)


__all__ = ["CLAIMS", "EXPERIMENTS", "ClaimsResult", "Part", "Verdict", "build_claims", "build_claims_report", "combine", "paired_bootstrap",
           "group_bootstrap", "rule_greater", "rule_less", "rule_null", "rule_exact", "format_table"]


