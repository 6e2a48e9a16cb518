"""Learning parity: whole runs of this harness vs the library a user would otherwise pick.

The parity claims of harness/conf/claims.yaml (C53-C56: ``ppo_gae`` vs stable-baselines3's PPO on
CartPole-v1, Acrobot-v1 and HalfCheetah-v5, ``a2c`` vs SB3's A2C on CartPole-v1, each experiment
sweeping ``reference: null,sb3``; C57-C58: ``recipe=trl_grpo`` / ``trl_rloo`` vs TRL's GRPOTrainer /
RLOOTrainer on lm_summarize, ``reference: null,trl``; harness/reference/) are run by the claims runner and judged by the
claims machinery like every other claim (registered margin, >= 10 seeds per side, interval at
Holm's level within the claims judged together). This script only drives them and writes the table:

1. unless ``--table-only``: ``python -m analysis claims DIR --run --only IDS`` (finished runs are
   reused; C55, HalfCheetah, is opt-in and runs only when named, as here);
2. ``python -m analysis claims DIR --only IDS`` (the verdicts, ``DIR/claims_only.json``);
3. a Markdown table (each side's final return with its 95% t interval and n, the difference with
   the claim's interval, the registered margin, the verdict, the area under the curve's
   difference), printed and, with ``--docs``, written into docs/parity.md (block ``parity``).

The verdicts here are those of a report holding only these claims (Holm over them); the full
claims report (docs/claims.md) judges them with every other claim.

Usage: python benchmarks/parity.py [--dir results/claims] [--only C53,C54,C55,C56,C57,C58] [--table-only] [--docs]
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.docs import write_block  # noqa: E402

PARITY = ("C53", "C54", "C55", "C56", "C57", "C58")


def _fmt(x: float) -> str:
    """Three significant digits (returns in the hundreds, gold scores below 1)."""
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.3g}"


def _interval(part: dict) -> str:
    return f"{_fmt(part['point'])} [{_fmt(part['low'])}, {_fmt(part['high'])}]"


SHORT = {"area under": "AUC", "KL to the reference": "KL to the reference"}  # the reported difference's label


def table(verdicts: list[dict], claims: dict) -> str:
    """The parity table from the claims report's verdicts (``claims``: harness/conf/claims.yaml's entries)."""
    rows = ["| claim | what | harness final [95%] | reference final [95%] | n per side | difference "
            "[claim's interval] | margin | verdict | also reported: harness - reference [95%] |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for v in verdicts:
        cid = v["claim"]
        if v.get("not_run"):
            rows.append(f"| {cid} | {claims[cid]['short']} | | | | | | not run: {v['not_run']} | |")
            continue
        rep = v.get("reported", [])
        final = [p for p in rep if p["name"].startswith("final")]
        ours = next((p for p in final if p["name"].endswith(", harness")), None)
        ref = next((p for p in final if p is not ours), None)
        also = [f"{label}: {_interval(p)}" for p in rep if " - " in p["name"]
                for key, label in SHORT.items() if p["name"].startswith(key)]
        primary = next(p for p in v["parts"] if p["role"] == "primary")
        n = f"{ours['n_units'] if ours else ''} / {ref['n_units'] if ref else ''}"
        rows.append(f"| {cid} | {claims[cid]['short']} | {_interval(ours) if ours else ''} | "
                    f"{_interval(ref) if ref else ''} | {n} | "
                    f"{_fmt(primary['point'])} [{_fmt(primary['low'])}, {_fmt(primary['high'])}] at "
                    f"{100 * primary['level']:.2f}% | {primary['rule']} | **{v['label']}** | {'; '.join(also)} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="results/claims")
    ap.add_argument("--only", default=",".join(PARITY))
    ap.add_argument("--table-only", action="store_true", help="judge and tabulate the runs there, run nothing")
    ap.add_argument("--docs", action="store_true", help="write the table into docs/parity.md (block parity)")
    a = ap.parse_args()
    if not a.table_only:
        subprocess.run([sys.executable, "-m", "analysis", "claims", a.dir, "--run", "--only", a.only], check=True)
    p = subprocess.run([sys.executable, "-m", "analysis", "claims", a.dir, "--only", a.only])
    if p.returncode not in (0, 1):
        sys.exit(p.returncode)
    import yaml

    claims = yaml.safe_load((ROOT / "harness" / "conf" / "claims.yaml").read_text())["claims"]
    report = json.loads((Path(a.dir) / "claims_only.json").read_text())
    wanted = a.only.split(",")
    md = table([v for v in report["verdicts"] if v["claim"] in wanted], claims)
    md += (f"\n\nVerdicts of `python -m analysis claims {a.dir} --only {a.only}` (Holm over these claims), "
           f"runs at commit {report.get('commit', '?')}, seed offset {report.get('seed_offset', 0)}.")
    print(md)
    if a.docs:
        write_block("docs/parity.md", "parity", md)


if __name__ == "__main__":
    main()
