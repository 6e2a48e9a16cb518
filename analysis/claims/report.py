"""claims.md / claims.json, every seed offset's verdicts side by side, the claims table and summary blocks."""
from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from harness.io.files import read_json

from . import CLAIMS_BY_ID, M_REGISTERED, PROTOCOL, Verdict, evaluate_all, registry
from .registry import commit
from .evidence import ExpData, NotRun, sweep_params
from .figures import claim_figure
from .plan import looks_of, variant
from .rules import PILOT, _finite


def _fmt(x: float) -> str:
    if x is None or not np.isfinite(x):
        return "—"
    a = abs(x)
    return f"{x:.3g}" if (1e-3 <= a < 1e4) or a == 0 else f"{x:.2e}"


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _ci(v) -> str:
    if not _finite(v.low, v.high):
        return "—"
    return f"[{_fmt(v.low)}, {_fmt(v.high)}]"


def _level(level: float) -> str:
    """A confidence level for a table: 95%, 99.9%, 99.86%."""
    pct = 100 * level
    for digits in range(0, 5):
        s = f"{pct:.{digits}f}"
        if abs(float(s) - pct) < 0.5 * 10 ** -digits and float(s) < 100:
            return s + "%"
    return f"{pct:.4f}%"


def report_name(seed_offset: int, quick: bool, suffix: str, only: bool = False) -> str:
    """claims.md / claims.json at offset 0, claims_seed<K>.* otherwise (quick: claims_quick*);
    a report of some claims only (``--only``) is ``claims*_only.*``, so it never replaces the
    report of every claim (and the stability table and README read only the latter)."""
    return f"claims{variant(quick, seed_offset)}{'_only' if only else ''}{suffix}"


def protocol_text(quick: bool) -> list[str]:
    """The report header: how every statistical verdict is reached (written from the protocol's numbers)."""
    p = PROTOCOL
    if quick:
        return ["**Pilot** (`--quick`): smaller budgets to test the pipeline in minutes. It prints each statistical "
                "claim's estimate with a nominal 95% interval and **no verdict**; only the exact checks are judged. "
                "The full command (without `--quick`) gives verdicts."]
    return [
        "How a statistical claim is judged (`harness/conf/claims.yaml`, `analysis/claims/`):",
        "",
        "- **Registered before the data.** One primary test per claim: a statistic, a rule and its smallest effect "
        "or margin with a one-line rationale. `harness/conf/claims_registry.json` (written by `python -m analysis "
        "claims --register`, history in git) holds the hash of the protocol and of everything that decides each "
        "claim (its primary test, checks, experiments and the defaults their runs inherit) with the date and commit "
        "it was registered at; a confirmatory `--run` refuses to start while the checkout differs from it "
        "(below: the registration, and any change since). Other quantities are reported, not judged; *premise* "
        "checks that fail make a claim **untestable here**, *power* checks that fail leave it **undecided**; "
        "neither ever refutes.",
        "- **Tests whose error is controlled on RL-shaped data** (`analysis/claims/intervals.py`): a seed-level "
        "quantity (one arm's per-seed values, or per-seed paired differences) registers its range and is judged "
        "by the betting confidence interval of a bounded mean (Waudby-Smith & Ramdas, JRSS-B 2023), valid for "
        "any distribution on that range at every n and every look; without a range it is undecided, with the "
        "reason. Probe statistics (thousands of batches): the delta method for ratios of batch means, the "
        "bootstrap standard error otherwise. Every method's error rate is checked at every level this report "
        "uses on skewed, bimodal, ceiling, zero-inflated, heavy-tailed, 0/1 and paired-with-failures data "
        "(`analysis/claims/calibration.py`; [the table](claims_protocol.md#error-rates-of-the-tests)). All seeds equal, or a "
        "standard error of 0, never decides a claim.",
        f"- **Error control**: Holm's step-down procedure over the whole registered family of {M_REGISTERED} "
        f"statistical claims keeps the family-wise error rate (any wrong decided verdict) at {p.alpha:g} whatever "
        "the dependence between claims (several share runs); a claim not tested here (not run, its premise not "
        "met, no information) counts with p = 1, so a claim's level does not depend on what else ran or on "
        "`--only`. Each claim's interval is shown at the level Holm tested it at (column *level*); a decided "
        f"claim's interval decides its rule there. Premise and power checks are read at {_level(p.check_level)}, "
        "unadjusted.",
        f"- **Enough seeds**: a claim trained on seeds is decided only with at least {p.min_seeds} seeds per arm; "
        "below that it is undecided, whatever its interval.",
        f"- **Sequential plan, by runs** (`analysis/claims/plan.py`): a training experiment may register looks "
        "(seeds per arm). Stage one runs every experiment at its first look; an experiment goes to its next look "
        "while one of its claims has not crossed its O'Brien-Fleming-type boundary (alpha spent across looks at the "
        f"Bonferroni level {p.alpha:g}/{M_REGISTERED}); a claim's p-value counts the alpha spent at earlier looks. "
        "No clock enters: the same command gives the same verdicts on a busy and on a quiet machine.",
        f"- **n needed**: for an undecided claim, the seeds (or batches) per arm that detect the *registered* effect "
        f"with {p.power:.0%} power at the level it was tested at, with the truth that effect past the rule's boundary "
        "(or at an equivalence band's centre, both ends to clear): in closed form for the normal methods, by "
        "simulating the betting rule on the observed values moved to that truth for a bounded mean; never at the "
        "observed effect.",
        "- **Undecided** means the data do not settle the claim at its level; **untestable here** means what the "
        "claim presupposes (e.g. reward hacking) did not happen in these runs, so the runs say nothing about it.",
    ]


DIVERGED_RULE = {"worst": "A run that diverged scores the task's worst return from its divergence to the budget (final "
                          "score and area under the curve; `analysis.stats`, the conservative default; "
                          "`--diverged last` carries its last evaluation forward instead).",
                 "last": "A run that diverged keeps its last evaluation from its divergence to the budget (`--diverged "
                         "last`; the default scores the task's worst return there)."}


def _rule_cell(c) -> str:
    """The primary's rule with its registered effect (named when the rule does not carry it)."""
    r = c.primary.rule
    carried = r.kind in ("equivalent", "between") or r.b > 0
    return r.text if carried else f"{r.text} (effect {c.primary.effect:g})"


def _verdict_cell(v: Verdict) -> str:
    if v.not_run:
        return _cell(v.label)
    return f"**{v.label}**" if v.verdict in ("supported", "refuted") else v.label


_STATE: list = []  # (registry, changes since it): read once per process


def registration_state() -> tuple[dict | None, list[str]]:
    """The claims registry (None when missing or unreadable) and what changed since it in this
    checkout (:func:`.registry.diff`; the reason, when there is no registry to compare with)."""
    if not _STATE:
        try:
            reg = registry.load()
            changes = [f"{registry.REGISTRY_FILE.name}: missing: nothing is registered"] if reg is None else \
                registry.diff(reg, registry.current())
        except ValueError as exc:
            reg, changes = None, [str(exc)]
        _STATE.append((reg, changes))
    return _STATE[0]


def _changes_of(cid: str, changes: list[str]) -> list[str]:
    return [line.partition(": ")[2] for line in changes if line.startswith(f"{cid}: ")]


def _registration_lines() -> list[str]:
    """The report's registration section: the registry's date and commit, what that registration
    changed, and what changed since (then no verdict here is confirmatory)."""
    reg, changes = registration_state()
    lines = []
    if reg is not None:
        lines += [f"`harness/conf/claims_registry.json` (`{registry.REGISTER_COMMAND}`; why a rule changed is in "
                  f"git's history): registered {reg.get('registered', '?')} at commit {reg.get('commit', '?')}, "
                  f"protocol hash `{(reg.get('protocol') or {}).get('hash', '?')}`, "
                  f"{len(reg.get('claims') or {})} statistical claims.", ""]
        lines += (["Changed at that registration:", ""] + [f"- {_cell(x)}" for x in reg.get("changed") or []]
                  if reg.get("changed") else ["Nothing changed at that registration."])
        lines.append("")
    if changes:
        lines += ["**Changed since the registration, in this checkout** (the verdicts of these claims are not "
                  f"confirmatory: `{registry.REGISTER_COMMAND}`, commit, and run again):", ""]
        lines += [f"- {_cell(x)}" for x in changes]
    else:
        lines.append("This checkout is the registered one: nothing changed since.")
    return lines


def _registry_record() -> dict:
    """The registration a report was judged against, for claims.json."""
    reg, changes = registration_state()
    return {"registered": (reg or {}).get("registered"), "commit": (reg or {}).get("commit"),
            "protocol_hash": ((reg or {}).get("protocol") or {}).get("hash"), "changed_since": changes}


def _registration_record(cid: str) -> dict | None:
    """A claim's registration for claims.json: date, commit, hash and what changed since."""
    reg, changes = registration_state()
    entry = ((reg or {}).get("claims") or {}).get(cid)
    if entry is None:
        return None
    return {"registered": entry.get("registered"), "commit": entry.get("commit"), "hash": entry.get("hash"),
            "changed_since": _changes_of(cid, changes)}


@dataclass(frozen=True)
class ReportSettings:
    """How a claims report is judged and named: ``quick`` (pilot estimates, no verdicts), ``only``
    (a subset of claim ids; None: all), ``seed_offset`` (the seeds it was run on, shifted by that
    much), ``diverged`` (the rule for diverged runs) and the ``command`` it names as its maker."""

    quick: bool = False
    only: set[str] | None = None
    seed_offset: int = 0
    diverged: str = "worst"
    command: str = ""


def write_report(root: Path, verdicts: list[Verdict], data: dict[str, ExpData], meta: dict,
                 settings: ReportSettings, wall_s: float) -> Path:
    quick, seed_offset, only = settings.quick, settings.seed_offset, bool(settings.only)
    fig_dir = root / f"claims_figures{variant(quick, seed_offset)}{'_only' if only else ''}"
    for v in verdicts:
        if not v.not_run and v.parts and not v.exact:
            v.figure = claim_figure(v, CLAIMS_BY_ID[v.claim], data, fig_dir)
    stat = [v for v in verdicts if not v.exact]
    exact = [v for v in verdicts if v.exact]
    lines = _report_header(root, stat, exact, settings, wall_s)
    lines += protocol_text(quick) + ["", DIVERGED_RULE[meta.get("diverged", "worst")], ""]
    lines += _statistical_table(stat) + _exact_table(exact)
    left_out = [r for name in sorted(data) for r in data[name].left_out()]
    missing = sum(e.missing() for e in data.values())
    # the JSON first: the stability section below reads every offset's JSON, this one's included
    _write_report_json(root, verdicts, meta, settings, wall_s, left_out, missing)
    stab = stability(root, quick)
    if len(stab["offsets"]) > 1 and not only:
        lines += ["", "## Stability across seed offsets", "", stability_table(stab), "",
                  f"Offsets judged in this folder: {', '.join(map(str, stab['offsets']))} "
                  f"(`python -m analysis claims DIR --run --seed-offset K`). {stab['summary']}"]
    if not quick:
        lines += ["", "## Registration", ""]
        lines += _registration_lines()
        lines += _plan_lines(data, meta.get("plan") or {})
    lines += _left_out_lines(root, left_out, missing, quick)
    lines += ["", "## Details", ""]
    for v in verdicts:
        lines += _details(v, data, root)
    lines += _experiment_lines(data, meta, quick)
    out = root / report_name(seed_offset, quick, ".md", only)
    atomic_write_text(out, "\n".join(lines) + "\n")
    return out


def _report_header(root: Path, stat: list[Verdict], exact: list[Verdict], settings: ReportSettings,
                   wall_s: float) -> list[str]:
    """The title and the summary line: mode, seeds, maker, and the verdicts counted."""
    quick = settings.quick
    counts = {k: sum(v.verdict == k and not v.not_run for v in stat) for k in
              ((PILOT,) if quick else ("supported", "refuted", "undecided", "untestable"))}
    not_run = sum(bool(v.not_run) for v in stat)
    tested = [v for v in stat if v.tested]
    return [f"# Claims report — {root}", "",
            f"Mode: **{'pilot (--quick)' if quick else 'full'}**; seeds offset by **{settings.seed_offset}**. "
            f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')} by "
            f"`{settings.command or 'python -m analysis claims ' + str(root)}` at commit {commit()}; judging took "
            f"{wall_s:.0f} s. {len(stat)} statistical claims: "
            + ", ".join(f"{n} {'untestable here' if k == 'untestable' else k}" for k, n in counts.items())
            + f", {not_run} not run" + ("" if quick else f"; {len(tested)} tested (the Holm family)")
            + f". {len(exact)} exact checks: {sum(v.verdict == 'supported' for v in exact)} passed.", ""]


def _statistical_table(stat: list[Verdict]) -> list[str]:
    lines = ["## Statistical claims", "",
             "| id | claim | primary statistic | n per arm | estimate | interval | level | rule (registered effect) | "
             "verdict | deciding |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for v in stat:
        c = CLAIMS_BY_ID[v.claim]
        p = v.primary
        if v.not_run or p is None:
            lines.append(f"| {c.id} | {_cell(c.text)} | {_cell(c.primary.name)} | — | — | — | — | "
                         f"{_cell(_rule_cell(c))} | {_verdict_cell(v)} | — |")
            continue
        lines.append(f"| {c.id} | {_cell(c.text)} | {_cell(p.name)} | {_cell(p.n)} | {_fmt(p.point)} | {_ci(p)} | "
                     f"{_level(p.level)} | {_cell(_rule_cell(c))} | {_verdict_cell(v)} | "
                     f"{_cell(v.deciding)} |")
    return lines


def _exact_table(exact: list[Verdict]) -> list[str]:
    lines = ["", "## Exact checks", "",
             "Identities checked by unit tests (`@pytest.mark.claim`), not statistical claims: not counted among "
             "the verdicts above or in the stability across seed offsets.", "",
             "| id | claim | tests | outcome |", "| --- | --- | --- | --- |"]
    for v in exact:
        c = CLAIMS_BY_ID[v.claim]
        outcome = v.label if v.not_run else ("passed" if v.verdict == "supported" else "failed")
        lines.append(f"| {c.id} | {_cell(c.text)} | {_cell(v.n or '—')} ({_cell(c.tests)}) | {_cell(outcome)} |")
    return lines


def _write_report_json(root: Path, verdicts: list[Verdict], meta: dict, settings: ReportSettings, wall_s: float,
                       left_out: list[dict], missing: int) -> None:
    """The report's JSON (claims.json and its variants): every verdict with its parts."""
    quick, only = settings.quick, bool(settings.only)
    atomic_write_json(root / report_name(settings.seed_offset, quick, ".json", only), {
        "mode": "quick" if quick else "full", "seed_offset": settings.seed_offset, "wall_s": wall_s,
        "only": sorted(v.claim for v in verdicts) if only else None, "commit": commit(),
        "protocol": PROTOCOL.__dict__, "registry": _registry_record(),
        "generated": time.strftime("%Y-%m-%d %H:%M:%S"), "verdicts": [
            {"claim": v.claim, "exact": v.exact, "verdict": v.verdict, "label": v.label, "statistic": v.statistic,
             "point": v.point, "low": v.low, "high": v.high, "level": v.level, "n": v.n, "not_run": v.not_run,
             "needs": v.needs, "deciding": v.deciding, "p": v.p, "p_adjusted": v.p_adjusted, "rank": v.rank,
             "m": v.m, "tested": v.tested, "registration": _registration_record(v.claim),
             "parts": [p.as_dict() for p in v.parts], "reported": [p.as_dict() for p in v.reported],
             "note": v.note} for v in verdicts],
        "plan": meta.get("plan"), "left_out": left_out, "not_run_yet": missing})


def _plan_lines(data: dict[str, ExpData], plan: dict) -> list[str]:
    """The sequential plan: each experiment's looks and how far this folder's runs went."""
    lines = ["", "## Sequential plan", "",
             "Looks (seeds per arm) each training experiment registered, and how far this folder's runs went "
             "(stage one is the first look).", "",
             "| experiment | looks | reached | why it went on |", "| --- | --- | --- | --- |"]
    for name in sorted(data):
        looks = looks_of(name)
        if len(looks) < 2:
            continue
        e = plan.get("experiments", {}).get(name, {})
        k = int(e.get("reached", 0))
        lines.append(f"| `{name}` | {', '.join(map(str, looks))} | {looks[k]} | "
                     f"{_cell('; '.join(e.get('why', [])) or '—')} |")
    return lines


def _left_out_lines(root: Path, left_out: list[dict], missing: int, quick: bool) -> list[str]:
    lines = ["", "## Runs left out", ""]
    if left_out:
        lines += [f"{len(left_out)} run director{'y' if len(left_out) == 1 else 'ies'} of the experiments are not "
                  "evidence (only finished runs are, by the harness's definition, `harness.io.finished`):", ""]
        lines += [f"- `{r['path']}`: {_cell(r['reason'])}" for r in left_out]
    else:
        lines.append("None.")
    if missing:
        lines += ["", f"{missing} run director{'y' if missing == 1 else 'ies'} not run yet (`python -m analysis claims "
                      f"{root} --run{' --quick' if quick else ''}` runs them)."]
    return lines


def _experiment_lines(data: dict[str, ExpData], meta: dict, quick: bool) -> list[str]:
    """Each claim experiment's sweep as run for this report, and its runs' outcomes."""
    lines = ["## Experiments", "",
             "Each claim experiment is a Hydra sweep (`python -m harness -m experiment=NAME`); seeds, budgets and "
             "fixed settings are in `harness/conf/experiment/NAME.yaml`. Sweep parameters as run for this report"
             + (" (with the --quick replacements)" if quick else "") + ":", "",
             "| experiment | sweep | configs | runs |", "| --- | --- | --- | --- |"]
    for name in sorted(set(data) | set(meta.get("skipped", {}))):
        if name in data:
            e = data[name]
            st = ", ".join(f"{n} {s_}" for s_, n in e.runs.status.value_counts().items()) if len(e.runs) else "—"
            try:
                sweep = "; ".join(f"`{k}={v}`" for k, v in sweep_params(name, quick).items())
            except NotRun:
                sweep = "—"
            lines.append(f"| `{name}` | {sweep} | {e.runs.point.nunique() if len(e.runs) else 0} | {st} |")
        else:
            lines.append(f"| `{name}` | — | — | not run: {_cell(meta['skipped'][name])} |")
    return lines


def _details(v: Verdict, data: dict[str, ExpData], root: Path) -> list[str]:
    c = CLAIMS_BY_ID[v.claim]
    lines = [f"### {c.id} — {v.label}", "", f"*Claim ({c.source}):* {c.text}.", ""]
    if c.exact:
        lines += [f"*Exact check:* {c.tests}.", ""]
        if v.note:
            lines += [v.note, ""]
        return lines
    pr = c.primary
    state, changes = registration_state()
    reg = registry.registration(c.id, state)
    if _changes_of(c.id, changes):
        reg += f" — **changed since: {'; '.join(_changes_of(c.id, changes))}**"
    lines += [f"*Primary test* ({reg}): {pr.name}; {pr.rule.sentence}. Registered effect {pr.effect:g}: "
              f"{pr.rationale}.", ""]
    if v.deciding:
        lines += [f"*Deciding:* {v.deciding}.", ""]
    if v.parts:
        lines += ["| part | role | estimate | interval | level | rule | n | method | outcome |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for p in v.parts:
            lines.append(f"| {_cell(p.name)} | {p.role} | {_fmt(p.point)} | {_ci(p)} | {_level(p.level)} | "
                         f"{_cell(p.rule)} | {_cell(p.n)} | {p.method} | {p.verdict} |")
        lines.append("")
    if v.tested:
        lines += [f"Primary p-value {_fmt(v.p)} (Holm rank {v.rank} of {v.m}, adjusted {_fmt(v.p_adjusted)}).", ""]
    if v.reported:
        lines += ["Reported, not judged (95% intervals): " + "; ".join(f"{p.name} {_fmt(p.point)} {_ci(p)} ({p.n})"
                                                                      for p in v.reported) + ".", ""]
    if v.needs:
        lines += [f"*Undecided:* {v.needs}.", ""]
    if v.note:
        lines += [v.note, ""]
    if c.experiments and c.experiments[0] in data:
        e = data[c.experiments[0]]
        st = e.runs.status.value_counts().to_dict() if len(e.runs) else {}
        lines += [f"Runs of `{c.experiments[0]}` in this folder: " + ", ".join(f"{n} {s}" for s, n in st.items())
                  + f" (`python -m harness -m experiment={c.experiments[0]}`).", ""]
    if v.figure:
        lines += [f"![{c.id}]({Path(v.figure).relative_to(root).as_posix()})", ""]
    return lines


# ============================================================================ stability

def _reports(root: Path, quick: bool) -> dict[int, dict[str, dict]]:
    """Every offset's whole report of this mode in ``root``: ``{offset: {claim: verdict record}}``."""
    reports = {}
    for f in sorted(Path(root).glob("claims*.json")):
        try:
            r = read_json(f)  # harness.io.files: the one reader of files in a results folder
        except (OSError, ValueError):  # RunFileError is a ValueError
            continue
        if r.get("mode") != ("quick" if quick else "full") or not isinstance(r.get("verdicts"), list) \
                or r.get("only"):  # a report of some claims (--only) is not an offset's report
            continue
        reports[int(r.get("seed_offset", 0))] = {v["claim"]: v for v in r["verdicts"]}
    return reports


DECIDED = ("supported", "refuted")


def stability(root: Path, quick: bool) -> dict:
    """Every offset judged in ``root`` (its claims*.json of the same mode): per *statistical*
    claim the verdict at each offset and ``stable`` (the same decided verdict at every offset),
    ``unstable`` (decided at two offsets, differently), ``not reproduced`` (decided at some
    offset, undecided or untestable at another: the rerun neither confirms nor contradicts it),
    ``undecided`` (decided at no offset), ``one offset only``, ``not run`` (at no offset). Exact
    checks are not seed-dependent and not counted."""
    reports = _reports(root, quick)
    offsets = sorted(reports)
    rows = []
    for cid in [c for c, claim in CLAIMS_BY_ID.items() if not claim.exact
                and any(c in rep for rep in reports.values())]:
        labels = {o: reports[o].get(cid) for o in offsets}
        # judged: in that offset's report and run there (a claim added since an offset was judged,
        # or not run at it, has nothing to compare: neither undecided nor unreproduced there)
        judged = {o: v for o, v in labels.items() if v and not v.get("not_run")}
        decided = {o: v["verdict"] for o, v in judged.items() if v["verdict"] in DECIDED}
        if not judged:
            status = "not run"  # at no offset (e.g. the opt-in MuJoCo experiment)
        elif len(judged) < 2:
            status = "one offset only"  # nothing to compare with yet
        elif len(set(decided.values())) > 1:
            status = "unstable"
        elif len(decided) == len(judged):
            status = "stable"
        elif decided:
            status = "not reproduced"
        else:
            status = "undecided"
        rows.append({"claim": cid, "verdicts": {o: (v["label"] if v else "—") for o, v in labels.items()},
                     "values": {o: (v.get("point"), v.get("low"), v.get("high")) if v else None
                                for o, v in labels.items()},
                     "status": status})
    n = {s: sum(r["status"] == s for r in rows)
         for s in ("stable", "unstable", "not reproduced", "undecided", "one offset only", "not run")}
    once = f" {n['one offset only']} judged at one offset only." if n["one offset only"] else ""
    once += f" {n['not run']} run at no offset." if n["not run"] else ""
    summary = (f"{n['stable']} claims decided the same way at every offset, {n['unstable']} unstable (decided "
               f"differently), {n['not reproduced']} not reproduced (decided at some offset, undecided or untestable "
               f"at another), {n['undecided']} decided at no offset.{once}" if len(offsets) > 1 else
               f"Judged at seed offset {offsets[0] if offsets else 0} only: no rerun on other seeds to compare with "
               "(python -m analysis claims DIR --run --seed-offset 1000).")
    return {"offsets": offsets, "rows": rows, "summary": summary}


def _short_label(label: str) -> str:
    return "not run" if label.startswith("not run") else label


def stability_table(stab: dict) -> str:
    head = "| id | " + " | ".join(f"offset {o}" for o in stab["offsets"]) + " | across offsets |"
    lines = [head, "|" + " --- |" * (len(stab["offsets"]) + 2)]
    for r in stab["rows"]:
        cells = []
        for o in stab["offsets"]:
            val = r["values"].get(o)
            stat = ""
            if val and val[0] is not None and not r["verdicts"][o].startswith("not run"):
                pt, lo, hi = val
                stat = f" {_fmt(pt)}" + (f" [{_fmt(lo)}, {_fmt(hi)}]" if lo is not None and hi is not None
                                          and _finite(lo, hi) and lo != hi else "")
            cells.append(_cell(_short_label(r["verdicts"][o]) + stat))
        status = f"**{r['status']}**" if r["status"] in ("unstable", "not reproduced") else r["status"]
        lines.append(f"| {r['claim']} | " + " | ".join(cells) + f" | {status} |")
    return "\n".join(lines)


README_START, README_END = "<!-- claims-table:start -->", "<!-- claims-table:end -->"
SUMMARY_START, SUMMARY_END = "<!-- claims-summary:start -->", "<!-- claims-summary:end -->"
TIME_START, TIME_END = "<!-- claims-time:start -->", "<!-- claims-time:end -->"
BLOCKS = {"claims-table": (README_START, README_END), "claims-summary": (SUMMARY_START, SUMMARY_END),
          "claims-time": (TIME_START, TIME_END)}


def _run_records(root: Path, quick: bool) -> dict[int, dict | None]:
    """Each offset's record of its last whole ``--run`` command (``claims_run*.json``: ``wall_s``,
    ``seconds`` per experiment, ``finished``), if any."""
    out = {}
    for o in stability(root, quick)["offsets"]:
        f = Path(root) / f"claims_run{variant(quick, o)}.json"
        try:
            rec = read_json(f)
            rec["wall_s"] = float(rec["wall_s"])
            out[o] = rec
        except (OSError, ValueError, KeyError, TypeError):
            out[o] = None
    return out


def _walls(root: Path, quick: bool) -> dict[int, float | None]:
    """Each offset's recorded wall time of its whole ``--run`` command (``claims_run*.json``), if any."""
    return {o: rec["wall_s"] if rec else None for o, rec in _run_records(root, quick).items()}


def time_block(root: Path, quick: bool, command: str) -> str:
    """Where each offset's last ``--run`` spent its time: minutes per experiment (stage one and its
    looks together), the exact tests and the judging, from ``claims_run*.json``; the rest of the
    wall time is startup and writing the report."""
    recs = {o: r for o, r in _run_records(root, quick).items() if r}
    if not recs:
        raise FileNotFoundError(f"no claims_run*.json in {root}: run python -m analysis claims {root} --run first")
    offsets = sorted(recs)
    names = sorted({k for r in recs.values() for k in r.get("seconds", {})},
                   key=lambda k: -sum(float(recs[o].get("seconds", {}).get(k, 0.0)) for o in offsets))
    lines = [f"Written by `{command}` on {time.strftime('%Y-%m-%d')} (commit {commit()}): minutes of each "
             "offset's last `--run` command, per experiment (its first look and later looks together; "
             "0.0: every run was already in the folder).", "",
             "| experiment | " + " | ".join(f"seeds +{o}" for o in offsets) + " |",
             "|" + " --- |" * (len(offsets) + 1)]
    for k in names:
        cells = [f"{float(recs[o]['seconds'][k]) / 60:.1f}" if k in recs[o].get("seconds", {}) else ""
                 for o in offsets]
        lines.append(f"| {_cell(k)} | " + " | ".join(cells) + " |")
    lines.append("| **wall time** | " + " | ".join(f"**{recs[o]['wall_s'] / 60:.1f}**" for o in offsets) + " |")
    lines.append("| finished | " + " | ".join(_cell(str(recs[o].get("finished", ""))) for o in offsets) + " |")
    lines.append("| started at commit | " + " | ".join(_cell(str(recs[o].get("commit", "not recorded")))
                                                      for o in offsets) + " |")
    return "\n".join(lines)


def readme_table(root: Path, quick: bool, command: str) -> str:
    """The claims table (docs/claims.md): every statistical claim's short text, each offset's verdict and
    primary statistic at its adjusted level, and the exact checks apart."""
    stab = stability(root, quick)
    if not stab["offsets"]:
        raise FileNotFoundError(f"no {'quick ' if quick else ''}claims report in {root}: run python -m analysis "
                                f"claims {root} first")
    by_claim = {r["claim"]: r for r in stab["rows"]}
    walls = _walls(root, quick)
    wall_text = "; ".join(f"offset {o}: {w / 60:.1f} min" for o, w in walls.items() if w)
    head = "| id | claim (source) | " + " | ".join(f"seeds +{o}" for o in stab["offsets"]) + " | across offsets |"
    lines = [f"Written by `{command}` on {time.strftime('%Y-%m-%d')} (commit {commit()}); each cell: verdict, "
             "primary statistic [interval at the level Holm tested it at]."
             + (f" Wall time of each offset's last `--run` command (its `claims_run*.json`; the notes say how "
                f"each was run): {wall_text}." if wall_text else ""), "",
             head, "|" + " --- |" * (len(stab["offsets"]) + 3)]
    for cid, r in by_claim.items():
        c = CLAIMS_BY_ID[cid]
        t = stability_table({"offsets": stab["offsets"], "rows": [r]}).splitlines()[-1]
        cells = t.split(" | ", 1)[1]
        lines.append(f"| {cid} | {_cell(c.short)} ({_cell(c.source)}) | {cells}")
    exact = [c for c in CLAIMS_BY_ID.values() if c.exact]
    latest = _reports(root, quick)[stab["offsets"][-1]]
    passed = [c.id for c in exact if latest.get(c.id, {}).get("verdict") == "supported"]
    lines += ["", stab["summary"], "",
              f"Exact checks (unit tests, not seed-dependent): {len(passed)} of {len(exact)} passed ("
              + ", ".join(f"{c.id} {c.short}" for c in exact) + ")."]
    return "\n".join(lines)


def summary_block(root: Path, quick: bool, command: str) -> str:
    """The claims summary (README): how many claims, each offset's verdict counts, the stability line."""
    stab = stability(root, quick)
    if not stab["offsets"]:
        raise FileNotFoundError(f"no {'quick ' if quick else ''}claims report in {root}: run python -m analysis "
                                f"claims {root} first")
    walls = _walls(root, quick)
    n_exact = sum(c.exact for c in CLAIMS_BY_ID.values())
    lines = [f"Written by `{command}` on {time.strftime('%Y-%m-%d')} (commit {commit()}).", "",
             f"{len(stab['rows'])} statistical claims{' (pilot budgets)' if quick else ''} (and {n_exact} exact "
             f"checks), judged at seed offset{'s' if len(stab['offsets']) > 1 else ''} "
             f"{', '.join(str(o) for o in stab['offsets'])} under Holm's family-wise control:", ""]
    for o in stab["offsets"]:
        labels = [r["verdicts"][o] for r in stab["rows"]]
        not_run = sum(lab.startswith("not run") or lab == "—" for lab in labels)
        counts = {v: sum(lab == v for lab in labels) for v in ("supported", "refuted", "undecided", "untestable here")}
        wall = f" (its last `--run`: {walls[o] / 60:.0f} min)" if walls.get(o) else ""
        lines.append(f"- seeds +{o}: {counts['supported']} supported, {counts['refuted']} refuted, "
                     f"{counts['undecided']} undecided, {counts['untestable here']} untestable here"
                     + (f", {not_run} not run" if not_run else "") + wall)
    lines += ["", stab["summary"]]
    return "\n".join(lines)


def markers_in(text: str) -> list[str]:
    """The claims blocks (``claims-table``, ``claims-summary``, ``claims-time``) whose start and end markers
    ``text`` holds."""
    return [name for name, (start, end) in BLOCKS.items() if start in text and end in text]


def update_readme(readme: Path, body: str, block: str = "claims-table") -> None:
    """Replace what lies between ``block``'s markers in the markdown file ``readme`` (any page) by ``body``."""
    start, end = BLOCKS[block]
    text = readme.read_text()
    if start not in text or end not in text:
        raise ValueError(f"{readme}: no {start} ... {end} markers")
    new = re.sub(re.escape(start) + r".*?" + re.escape(end),
                 lambda _: f"{start}\n{body}\n{end}", text, flags=re.S)
    atomic_write_text(readme, new)


def update_pages(pages: list[Path], root: Path, quick: bool, command: str) -> list[str]:
    """Write every claims block each page has markers for (``claims-table``: the table,
    ``claims-summary``: the counts, ``claims-time``: where each offset's ``--run`` spent its time);
    returns ``"page: block"`` for each block written."""
    bodies = {"claims-table": readme_table, "claims-summary": summary_block, "claims-time": time_block}
    done = []
    for page in pages:
        for block in markers_in(page.read_text()):
            update_readme(page, bodies[block](root, quick, command), block)
            done.append(f"{page}: {block}")
    return done


def publish(root: Path, quick: bool, dest: Path, command: str) -> list[Path]:
    """Copy every offset's whole report and its figures into ``dest`` (a docs folder), each page
    headed by the command, date and commit that wrote it; returns the pages written."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    pages = []
    for o in stability(root, quick)["offsets"]:
        md = Path(root) / report_name(o, quick, ".md")
        figs = Path(root) / f"claims_figures{variant(quick, o)}"
        if not md.is_file():
            continue
        text = md.read_text()
        text = re.sub(r"^# Claims report — .*$", f"# Claims report, seed offset {o}", text, count=1, flags=re.M)
        head = (f"Generated: copied from `{md.name}` by `{command}` on {time.strftime('%Y-%m-%d')} (commit "
                f"{commit()}); do not edit by hand.\n\n")
        text = text.replace("\n", "\n" + head, 1)
        text = text.replace("(claims_protocol.md#error-rates-of-the-tests)", "(../claims_protocol.md#error-rates-of-the-tests)")
        out = dest / md.name
        atomic_write_text(out, text)
        pages.append(out)
        if figs.is_dir():
            target = dest / figs.name
            if target.exists():
                shutil.rmtree(target)
            target.mkdir()
            for f in sorted(figs.iterdir()):  # each through the atomic write: a full disk names the file
                if f.is_file() and not f.is_symlink():
                    atomic_write_bytes(target / f.name, f.read_bytes())
    return pages


# ============================================================================ entry points

@dataclass
class ClaimsResult:
    """What :func:`build_claims` wrote and judged; ``left_out``: runs that are not evidence
    (``{"experiment", "path", "status", "reason"}``), ``missing``: run directories never run."""

    out: Path
    verdicts: list[Verdict]
    left_out: list[dict]
    missing: int


def build_claims(root: str | Path, settings: ReportSettings = ReportSettings(), *,
                 progress: Callable[[str], None] = print, judged: tuple | None = None) -> ClaimsResult:
    """Judge the claims on what ``root`` holds; write the report, its JSON and figures there.
    ``judged``: ``(verdicts, data, meta)`` of an :func:`evaluate_all` on the same folder with
    nothing run since, reported without judging again."""
    root = Path(root).resolve()  # as harness.experiments wrote it (results_dir=<root>/<experiment>)
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    verdicts, data, meta = judged or evaluate_all(root, quick=settings.quick, only=settings.only,
                                                  seed_offset=settings.seed_offset, diverged=settings.diverged)
    out = write_report(root, verdicts, data, meta, settings, time.time() - t0)
    left_out = [r for name in sorted(data) for r in data[name].left_out()]
    return ClaimsResult(out, verdicts, left_out, sum(e.missing() for e in data.values()))


def build_claims_report(root: str | Path, *, quick: bool = False, only: set[str] | None = None,
                        seed_offset: int = 0, progress: Callable[[str], None] = print) -> tuple[Path, list[Verdict]]:
    res = build_claims(root, ReportSettings(quick=quick, only=only, seed_offset=seed_offset), progress=progress)
    return res.out, res.verdicts


def format_table(verdicts: list[Verdict]) -> str:
    rows = []
    for v in verdicts:
        c = CLAIMS_BY_ID[v.claim]
        if c.exact:
            rows.append(f"  {v.claim:<4} exact check: {v.label if v.not_run else ('passed' if v.verdict == 'supported' else 'failed')}")
            continue
        stat = "" if v.not_run else f"{_fmt(v.point)} {_ci(v)} at {_level(v.level)}"
        label = v.label if v.verdict != PILOT else "pilot (no verdict)"
        rows.append(f"  {v.claim:<4} {label[:60]:<60} {stat}")
        if v.needs:
            rows.append(f"       {v.needs[:160]}")
    return "\n".join(rows)
