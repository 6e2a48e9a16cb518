"""claims.md / claims.json, every seed offset's verdicts side by side, the claims table and summary blocks."""
from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.io import atomic_write_json, atomic_write_text

from . import CLAIMS_BY_ID, Verdict, evaluate_all
from .evidence import ExpData, NotRun, sweep_params
from .figures import claim_figure
from .plan import variant
from .rules import POWER_FACTOR, VERDICTS, Part, _finite


def _fmt(x: float) -> str:
    if x is None or not np.isfinite(x):
        return "—"
    a = abs(x)
    return f"{x:.3g}" if (1e-3 <= a < 1e4) or a == 0 else f"{x:.2e}"


def _cell(text) -> str:
    return str(text).replace("|", "\\|")


def _ci(v: Verdict | Part) -> str:
    if not _finite(v.low, v.high) or (v.low == v.high):
        return "—"
    return f"[{_fmt(v.low)}, {_fmt(v.high)}]"


def report_name(seed_offset: int, quick: bool, suffix: str, only: bool = False) -> str:
    """claims.md / claims.json at offset 0, claims_seed<K>.* otherwise (quick: claims_quick*);
    a report of some claims only (``--only``) is ``claims*_only.*``, so it never replaces the
    report of every claim (and the stability table and README read only the latter)."""
    return f"claims{variant(quick, seed_offset)}{'_only' if only else ''}{suffix}"


PLAN_TEXT = ("Two-stage design (`analysis/claims/plan.py`): stage one runs every experiment at its stated n; an "
             "undecided claim's experiment is extended once to the n its power computation asks for (every training "
             "config to that many seeds, every probe config to that many batches) when that is at most 25x the "
             "stated n and its estimated time fits the budget left, cheapest first; verdicts are then judged on the "
             "extended runs.")
DIVERGED_RULE = {"worst": "A run that diverged scores the task's worst return from its divergence to the budget (final "
                           "score and area under the curve; `analysis.stats`, the conservative default; "
                           "`--diverged last` carries its last evaluation forward instead).",
                 "last": "A run that diverged keeps its last evaluation from its divergence to the budget (`--diverged "
                         "last`; the default scores the task's worst return there)."}


def write_report(root: Path, verdicts: list[Verdict], data: dict[str, ExpData], meta: dict, quick: bool,
                 seed_offset: int, wall_s: float, only: bool = False) -> Path:
    fig_dir = root / f"claims_figures{variant(quick, seed_offset)}{'_only' if only else ''}"
    for v in verdicts:
        if not v.not_run and v.parts:
            v.figure = claim_figure(v, CLAIMS_BY_ID[v.claim], data, fig_dir)
    counts = {k: sum(v.verdict == k and not v.not_run for v in verdicts) for k in VERDICTS}
    not_run = sum(bool(v.not_run) for v in verdicts)
    lines = [f"# Claims report — {root}", "",
             f"Mode: **{'quick' if quick else 'full'}**" + (" (smaller budgets, wider intervals; LM claims skipped)"
                                                            if quick else "")
             + f"; seeds offset by **{seed_offset}**. Generated {time.strftime('%Y-%m-%d %H:%M:%S')} in {wall_s:.0f} s. "
             + ", ".join(f"{n} {k}" for k, n in counts.items()) + f", {not_run} not run.", "",
             "Intervals are 95% bootstrap percentile intervals (paired over shared batches or seeds where two configs "
             "saw the same samples). Each claim's rules are data (`conf/claims.yaml`), fixed before data is read: "
             "an effect `> t` is supported when the interval lies above t and refuted when below; an equivalence "
             "`= c (+-tol)` (two one-sided tests on the same interval) is supported when the interval lies inside "
             "[c - tol, c + tol] and refuted when wholly outside; `in (a, b)` likewise for a small but present effect. "
             "A claim is supported when all its judged parts are, refuted when any is; a power check that fails "
             "leaves it inconclusive. Undecided parts state about how much data would decide them: the half-width "
             f"h at n shrinks as 1/sqrt(n), so deciding needs n (h/m)^2 x {POWER_FACTOR:.2f} (80% power) where m is "
             "the distance from the point estimate to the boundary it must clear. "
             + DIVERGED_RULE[meta.get("diverged", "worst")], "",
             "| id | claim | source | statistic | value | 95% interval | n | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for v in verdicts:
        c = CLAIMS_BY_ID[v.claim]
        verdict = f"**{v.verdict}**" if not v.not_run else v.label
        value = "—" if v.not_run else (f"{int(v.point)} passed" if c.exact else _fmt(v.point))
        lines.append(f"| {c.id} | {_cell(c.text)} | {c.source} | {_cell(v.statistic or '—')} | {value} | "
                     f"{'—' if c.exact else _ci(v)} | {v.n or '—'} | {_cell(verdict)} |")
    left_out = [r for name in sorted(data) for r in data[name].left_out()]
    missing = sum(e.missing() for e in data.values())
    # the JSON first: the stability section below reads every offset's JSON, this one's included
    atomic_write_json(root / report_name(seed_offset, quick, ".json", only), {
        "mode": "quick" if quick else "full", "seed_offset": seed_offset, "wall_s": wall_s,
        "only": sorted(v.claim for v in verdicts) if only else None,
        "generated": time.strftime("%Y-%m-%d %H:%M:%S"), "verdicts": [
            {"claim": v.claim, "verdict": v.verdict, "label": v.label, "statistic": v.statistic, "point": v.point,
             "low": v.low, "high": v.high, "n": v.n, "not_run": v.not_run, "needs": v.needs,
             "parts": [{k: val for k, val in p.__dict__.items() if k != "spec"} for p in v.parts],
             "reported": [{k: val for k, val in p.__dict__.items() if k != "spec"} for p in v.reported],
             "note": v.note} for v in verdicts],
        "left_out": left_out, "not_run_yet": missing})
    stab = stability(root, quick)
    if len(stab["offsets"]) > 1 and not only:
        lines += ["", "## Stability across seed offsets", "", stability_table(stab), "",
                  f"Offsets judged in this folder: {', '.join(map(str, stab['offsets']))} "
                  f"(`python -m analysis claims DIR --run --seed-offset K`). {stab['summary']}"]
    plan = meta.get("plan") or {}
    if plan.get("experiments"):
        lines += ["", "## Second stage", "", PLAN_TEXT + f" Budget left after stage one: "
                  f"{plan.get('budget_left_s', 0) / 60:.1f} min.", "",
                  "| experiment | extended to | x stated n | estimated time | status | undecided parts |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for name, e in plan["experiments"].items():
            to = ", ".join(f"{k} {e[k]}" for k in ("population", "batches") if e.get(k))
            status = e.get("status", "") + (f" ({e['why']})" if e.get("why") else "")
            lines.append(f"| `{name}` | {to} | {e.get('factor', '')} | {e.get('cost_s', 0) / 60:.1f} min | "
                         f"{_cell(status)} | {_cell('; '.join(e.get('parts', [])))} |")
    lines += ["", "## Runs left out", ""]
    if left_out:
        lines += [f"{len(left_out)} run director{'y' if len(left_out) == 1 else 'ies'} of the experiments are not "
                  "evidence (only finished runs are, by the harness's definition, `harness.io.finished`):", ""]
        lines += [f"- `{r['path']}`: {_cell(r['reason'])}" for r in left_out]
    else:
        lines.append("None.")
    if missing:
        lines += ["", f"{missing} run director{'y' if missing == 1 else 'ies'} not run yet (`python -m analysis claims "
                      f"{root} --run{' --quick' if quick else ''}` runs them)."]
    lines += ["", "## Details", ""]
    for v in verdicts:
        c = CLAIMS_BY_ID[v.claim]
        lines += [f"### {c.id} — {v.label}", "", f"*Claim ({c.source}):* {c.text}.", "", f"*Rule:* {c.rule}.", ""]
        if v.parts:
            lines += ["| part | value | 95% interval | rule | n | outcome | deciding needs |",
                      "| --- | --- | --- | --- | --- | --- | --- |"]
            for p in v.parts:
                role = " (power check)" if p.role == "power" else ""
                need = f"about n = {p.n_needed:g} {p.unit}" if p.verdict == "inconclusive" and p.n_needed else "—"
                lines.append(f"| {_cell(p.name)}{role} | {_fmt(p.point)} | {_ci(p)} | {_cell(p.rule)} | {p.n} | "
                             f"{p.verdict} | {need} |")
            lines.append("")
        if v.reported:
            lines += ["Reported, not judged: " + "; ".join(f"{p.name} {_fmt(p.point)} {_ci(p)} ({p.n})"
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
    lines += ["## Experiments", "",
              "Each claim experiment is a Hydra sweep (`python -m harness -m experiment=NAME`); seeds, budgets and "
              "fixed settings are in `conf/experiment/NAME.yaml`. Sweep parameters as run for this report"
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
            lines.append(f"| `{name}` | — | — | not run: {meta['skipped'][name]} |")
    out = root / report_name(seed_offset, quick, ".md", only)
    atomic_write_text(out, "\n".join(lines) + "\n")
    return out


# ============================================================================ stability

def stability(root: Path, quick: bool) -> dict:
    """Every offset judged in ``root`` (its claims*.json of the same mode): per claim the verdict
    at each offset and ``stable`` (the same decided verdict at every offset), ``unstable``
    (decided at two offsets, differently), ``not reproduced`` (decided at some offset,
    inconclusive at another: the rerun neither confirms nor contradicts it), ``undecided``
    (decided at no offset)."""
    reports = {}
    for f in sorted(root.glob("claims*.json")):
        try:
            r = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if r.get("mode") != ("quick" if quick else "full") or not isinstance(r.get("verdicts"), list) \
                or r.get("only"):  # a report of some claims (--only) is not an offset's report
            continue
        reports[int(r.get("seed_offset", 0))] = {v["claim"]: v for v in r["verdicts"]}
    offsets = sorted(reports)
    rows = []
    for cid in [c for c in CLAIMS_BY_ID if any(c in rep for rep in reports.values())]:
        labels = {o: reports[o].get(cid) for o in offsets}
        # judged: in that offset's report and run there (a claim added since an offset was judged,
        # or not run at it, has nothing to compare: neither undecided nor unreproduced there)
        judged = {o: v for o, v in labels.items() if v and not v.get("not_run")}
        decided = {o: v["verdict"] for o, v in judged.items() if v["verdict"] in ("supported", "refuted")}
        if len(judged) < 2:
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
         for s in ("stable", "unstable", "not reproduced", "undecided", "one offset only")}
    once = f" {n['one offset only']} judged at one offset only." if n["one offset only"] else ""
    summary = (f"{n['stable']} claims decided the same way at every offset, {n['unstable']} unstable (decided "
               f"differently), {n['not reproduced']} not reproduced (decided at some offset, inconclusive at "
               f"another), {n['undecided']} undecided at every offset.{once}" if len(offsets) > 1 else
               f"Judged at seed offset {offsets[0] if offsets else 0} only: no rerun on other seeds to compare with "
               "(python -m analysis claims DIR --run --seed-offset 1000).")
    return {"offsets": offsets, "rows": rows, "summary": summary}


def _short_label(label: str) -> str:
    return "not run" if label.startswith("inconclusive — not run") else label


def stability_table(stab: dict) -> str:
    head = "| id | " + " | ".join(f"offset {o}" for o in stab["offsets"]) + " | across offsets |"
    lines = [head, "|" + " --- |" * (len(stab["offsets"]) + 2)]
    for r in stab["rows"]:
        cells = []
        for o in stab["offsets"]:
            val = r["values"].get(o)
            stat = ""
            if val and val[0] is not None and not r["verdicts"][o].startswith("inconclusive — not run"):
                pt, lo, hi = val
                stat = f" {_fmt(pt)}" + (f" [{_fmt(lo)}, {_fmt(hi)}]" if lo is not None and hi is not None
                                          and _finite(lo, hi) and lo != hi else "")
            cells.append(_cell(_short_label(r["verdicts"][o]) + stat))
        status = f"**{r['status']}**" if r["status"] in ("unstable", "not reproduced") else r["status"]
        lines.append(f"| {r['claim']} | " + " | ".join(cells) + f" | {status} |")
    return "\n".join(lines)


README_START, README_END = "<!-- claims-table:start -->", "<!-- claims-table:end -->"
SUMMARY_START, SUMMARY_END = "<!-- claims-summary:start -->", "<!-- claims-summary:end -->"
BLOCKS = {"claims-table": (README_START, README_END), "claims-summary": (SUMMARY_START, SUMMARY_END)}


def readme_table(root: Path, quick: bool, command: str) -> str:
    """The claims table (docs/claims.md): every claim's short text, each offset's verdict and statistic."""
    stab = stability(root, quick)
    if not stab["offsets"]:
        raise FileNotFoundError(f"no {'quick ' if quick else ''}claims report in {root}: run python -m analysis "
                                f"claims {root} first")
    by_claim = {r["claim"]: r for r in stab["rows"]}
    head = "| id | claim (source) | " + " | ".join(f"seeds +{o}" for o in stab["offsets"]) + " | across offsets |"
    lines = [f"Written by `{command}` on {time.strftime('%Y-%m-%d')}; "
             f"each cell: verdict, primary statistic [95% interval].", "", head,
             "|" + " --- |" * (len(stab["offsets"]) + 3)]
    for cid, r in by_claim.items():
        c = CLAIMS_BY_ID[cid]
        t = stability_table({"offsets": stab["offsets"], "rows": [r]}).splitlines()[-1]
        cells = t.split(" | ", 1)[1]
        lines.append(f"| {cid} | {_cell(c.short)} ({_cell(c.source)}) | {cells}")
    lines += ["", stab["summary"]]
    return "\n".join(lines)


def summary_block(root: Path, quick: bool, command: str) -> str:
    """The claims summary (README): how many claims, each offset's verdict counts, the stability line."""
    stab = stability(root, quick)
    if not stab["offsets"]:
        raise FileNotFoundError(f"no {'quick ' if quick else ''}claims report in {root}: run python -m analysis "
                                f"claims {root} first")
    lines = [f"Written by `{command}` on {time.strftime('%Y-%m-%d')}.", "",
             f"{len(stab['rows'])} claims{' (quick budgets)' if quick else ''}, judged at seed "
             f"offset{'s' if len(stab['offsets']) > 1 else ''} {', '.join(str(o) for o in stab['offsets'])}:", ""]
    for o in stab["offsets"]:
        labels = [r["verdicts"][o] for r in stab["rows"]]
        not_run = sum(lab.startswith("inconclusive — not run") or lab == "—" for lab in labels)
        counts = {v: sum(lab == v for lab in labels) for v in ("supported", "refuted")}
        undecided = len(labels) - not_run - sum(counts.values())
        lines.append(f"- seeds +{o}: {counts['supported']} supported, {counts['refuted']} refuted, "
                     f"{undecided} inconclusive" + (f", {not_run} not run" if not_run else ""))
    lines += ["", stab["summary"]]
    return "\n".join(lines)


def markers_in(text: str) -> list[str]:
    """The claims blocks (``claims-table``, ``claims-summary``) whose start and end markers ``text`` holds."""
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
    ``claims-summary``: the counts); returns ``"page: block"`` for each block written."""
    bodies = {"claims-table": readme_table, "claims-summary": summary_block}
    done = []
    for page in pages:
        for block in markers_in(page.read_text()):
            update_readme(page, bodies[block](root, quick, command), block)
            done.append(f"{page}: {block}")
    return done


# ============================================================================ entry points

@dataclass
class ClaimsResult:
    """What :func:`build_claims` wrote and judged; ``left_out``: runs that are not evidence
    (``{"experiment", "path", "status", "reason"}``), ``missing``: run directories never run."""

    out: Path
    verdicts: list[Verdict]
    left_out: list[dict]
    missing: int


def build_claims(root: str | Path, *, quick: bool = False, only: set[str] | None = None, seed_offset: int = 0,
                 diverged: str = "worst", progress: Callable[[str], None] = print,
                 judged: tuple | None = None) -> ClaimsResult:
    """Judge the claims on what ``root`` holds; write the report, its JSON and figures there.
    ``judged``: ``(verdicts, data, meta)`` of an :func:`evaluate_all` on the same folder with
    nothing run since (``--run`` whose second stage ran nothing), reported without judging again."""
    root = Path(root).resolve()  # as harness.experiments wrote it (results_dir=<root>/<experiment>)
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    verdicts, data, meta = judged or evaluate_all(root, quick=quick, only=only, seed_offset=seed_offset,
                                                  diverged=diverged)
    out = write_report(root, verdicts, data, meta, quick, seed_offset, time.time() - t0, only=bool(only))
    left_out = [r for name in sorted(data) for r in data[name].left_out()]
    return ClaimsResult(out, verdicts, left_out, sum(e.missing() for e in data.values()))


def build_claims_report(root: str | Path, *, quick: bool = False, only: set[str] | None = None,
                        seed_offset: int = 0, progress: Callable[[str], None] = print) -> tuple[Path, list[Verdict]]:
    res = build_claims(root, quick=quick, only=only, seed_offset=seed_offset, progress=progress)
    return res.out, res.verdicts


def format_table(verdicts: list[Verdict]) -> str:
    rows = []
    for v in verdicts:
        stat = f"{_fmt(v.point)} {_ci(v)}" if not v.not_run and not CLAIMS_BY_ID[v.claim].exact else ""
        rows.append(f"  {v.claim:<4} {v.label[:70]:<70} {stat}")
        if v.needs:
            rows.append(f"       {v.needs[:150]}")
    return "\n".join(rows)
