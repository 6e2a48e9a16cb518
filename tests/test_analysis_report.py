"""`python -m analysis report` on a synthetic sweep, and its one-line errors."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from analysis.cli import main
from analysis.report import FIGURES
from tests.analysis_fixtures import make_sweep

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return make_sweep(tmp_path_factory.mktemp("results"), extras=True)


def _direct_final_scores(root: Path, last_n: int = 5) -> pd.DataFrame:
    """Final score per finished run straight from the files, without the analysis package:
    the mean of the last ``last_n`` evaluations (each config its own estimator label); a diverged run (the fixture's runs record no
    task.worst_return) scores the lowest evaluation of any finished run of its task."""
    rows, lowest = [], {}
    for path in sorted(root.rglob("metrics.parquet")):
        if not (path.parent / "summary.json").exists():
            continue                                    # still running: left out
        m = pd.read_parquet(path).sort_values("iteration")
        ev = m["eval_return"].dropna()
        ev = ev[np.isfinite(ev)]
        task = m["task"].iloc[0]
        lowest[task] = min(lowest.get(task, np.inf), ev.min())
        diverged = json.loads((path.parent / "summary.json").read_text())["status"] == "diverged"
        est = m["estimator"].iloc[0]
        if est == "ppo_gae":  # the fixture sweeps its gae_lambda: one config (row) per value
            est = f"ppo_gae[gae_lambda={m['gae_lambda'].iloc[0]:g}]"
        rows.append({"task": task, "estimator": est,
                     "score": np.nan if diverged else ev.tail(last_n).mean()})
    out = pd.DataFrame(rows)
    return out.assign(score=out["score"].fillna(out["task"].map(lowest)))


def _table_rows(md: str, section: str, first_cells: tuple[str, str]) -> list[str]:
    body = md.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    prefix = "| " + " | ".join(first_cells) + " |"
    return [line for line in body.splitlines() if line.startswith(prefix)]


def test_report_on_synthetic_sweep(sweep, capsys):
    assert main(["report", str(sweep), "--reps", "300"]) == 0
    out_dir = sweep / "report"
    stdout = capsys.readouterr().out
    assert stdout.strip().splitlines()[-1] == f"report: {out_dir / 'report.md'}"
    # 1 run of ppo_gae[gae_lambda=0.9] per task: below MIN_PROFILE_RUNS, so no profiles figure
    drawn = {k: v for k, v in FIGURES.items() if k != "performance_profiles"}
    assert stdout.count("figure: ") == len(drawn)

    for name, _ in drawn.values():
        png = out_dir / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert png.stat().st_size > 10_000, name        # not a blank canvas
    assert not (out_dir / "performance_profiles.png").exists()
    md = (out_dir / "report.md").read_text()
    assert "Left out: performance profiles need at least 5 scored runs of every estimator on a task " \
           "(here as few as 1)" in md
    for link in re.findall(r"\]\(([^)]+\.png)\)", md):
        assert (out_dir / link).exists(), link          # links are relative to report.md
    assert "**1 left out**" in md and "1 diverged" in md
    running = (sweep / "CartPole-v1" / "reinforce" / "seed3").as_posix()
    assert f"- `{running}`: no summary.json (not run, still running or killed)" in md
    assert f"  left out: {running}: no summary.json (not run, still running or killed)" in stdout.splitlines()
    assert "1 run(s) left out (not scored):" in stdout

    # IQM in report.md == scipy trim_mean of per-run final scores computed directly.
    direct = _direct_final_scores(sweep)
    checked = 0
    for (task, est), g in direct.groupby(["task", "estimator"]):
        expected = scipy.stats.trim_mean(g["score"].to_numpy(), 0.25)
        (row,) = _table_rows(md, "Final scores", (task, est))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == f"{len(g)}/{len(g)}"
        assert float(cells[3]) == pytest.approx(expected, abs=0.006)   # printed to 2 decimals
        lo, hi = map(float, cells[4].strip("[]").split(","))
        assert lo <= float(cells[3]) <= hi
        checked += 1
    assert checked == 8
    # The 4 CartPole runs per estimator: IQM drops 1 at each end -> differs from the mean.
    g = direct[(direct.task == "CartPole-v1") & (direct.estimator == "rloo")]["score"].sort_values()
    assert scipy.stats.trim_mean(g, 0.25) == pytest.approx(g.iloc[1:3].mean())

    # diverged / collapsed counts per estimator (fixture: ppo_gae 1 diverged, rloo 1 collapsed)
    fails = pd.read_csv(out_dir / "failures.csv").set_index("estimator")
    assert fails.loc["ppo_gae[gae_lambda=0.95]", "diverged"] == 1 and fails.loc["rloo", "collapsed"] == 1
    assert fails["diverged"].sum() == 1 and fails["collapsed"].sum() == 1
    assert fails.loc["reinforce", "left_out"] == 1 and fails["left_out"].sum() == 1
    left = pd.read_csv(out_dir / "left_out.csv")
    assert left[["run_dir", "reason"]].values.tolist() == [
        ["CartPole-v1/reinforce/seed3", "no summary.json (not run, still running or killed)"]]

    # the swept gae_lambda of ppo_gae is found, nothing else
    sens = pd.read_csv(out_dir / "sensitivity.csv")
    assert set(sens["hyperparameter"]) == {"gae_lambda"} and set(sens["estimator"]) == {"ppo_gae"}


def test_report_wall_time_axis_and_out_dir(sweep, tmp_path):
    out = tmp_path / "figs"
    assert main(["report", str(sweep), "--x", "wall_time_s", "--last-n", "2", "--reps", "100",
                 "--out", str(out)]) == 0
    assert (out / "report.md").exists() and (out / "learning_curves.png").exists()
    assert "--last-n 2" in (out / "report.md").read_text()


def test_report_states_the_diverged_rule_and_the_fallback(sweep, tmp_path, capsys):
    """The fixture's diverged run (CartPole-v1 ppo_gae seed3) records no task.worst_return."""
    diverged = "CartPole-v1/ppo_gae/seed3"
    lowest = _direct_final_scores(sweep).query("task == 'CartPole-v1'")["score"].min()
    md, runs = {}, {}
    for rule in ("worst", "last"):
        assert main(["report", str(sweep), "--reps", "50", "--diverged", rule, "--out", str(tmp_path / rule)]) == 0
        md[rule] = (tmp_path / rule / "report.md").read_text()
        runs[rule] = pd.read_csv(tmp_path / rule / "runs.csv").set_index("run_dir")
        assert f"--diverged {rule}`" in md[rule]
    stdout = capsys.readouterr().out
    worst_rule = ("Diverged runs are scored with their task's worst return from the divergence on "
                  "(`--diverged worst`, the default)")
    last_rule = "Diverged runs are scored by carrying their last evaluations forward (`--diverged last`)"
    assert worst_rule in md["worst"] and last_rule not in md["worst"]
    assert last_rule in md["last"] and worst_rule not in md["last"]
    assert "1 diverged run records no `task.worst_return`" in md["worst"]
    assert "lowest score observed among all runs of its task" in md["worst"]
    assert "records no `task.worst_return`" not in md["last"]
    assert worst_rule in stdout and last_rule in stdout
    assert runs["worst"].loc[diverged, "score"] == pytest.approx(lowest)
    assert runs["worst"].loc[diverged, "score"] < runs["last"].loc[diverged, "score"]
    assert runs["worst"].loc[diverged, "auc"] < runs["last"].loc[diverged, "auc"]
    completed = runs["worst"].index != diverged   # every other run: the same under both rules
    assert runs["worst"].loc[completed, ["score", "auc"]].equals(runs["last"].loc[completed, ["score", "auc"]])


def _cli(*args):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "analysis", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_empty_folder_is_a_one_line_error(tmp_path):
    r = _cli("report", str(tmp_path))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "run directories with metrics.parquet" in lines[0] and str(tmp_path) in lines[0]
    assert not (tmp_path / "report").exists()


def test_missing_folder_and_file_are_one_line_errors(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("x")
    for target in (tmp_path / "missing", f):
        assert main(["report", str(target)]) == 2
    r = _cli("report", str(tmp_path / "missing"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "does not exist" in r.stderr and "metrics.parquet" in r.stderr


def test_report_never_pools_update_or_loss_agg(tmp_path):
    from analysis.load import load
    from analysis.report import compute_tables
    from tests.analysis_fixtures import _summary, curve_columns, write_run

    for seed, update in enumerate(["clip", "clip", "pg", "pg"]):
        cols = curve_columns("CartPole-v1", "ppo_gae", seed, iterations=8)
        cols["update"], cols["loss_agg"] = [update] * 8, ["token_mean"] * 8
        write_run(tmp_path / "CartPole-v1" / "ppo_gae" / f"s{seed}", cols,
                  summary=_summary(str(seed), "completed", 8))
    t = compute_tables(load(tmp_path), reps=50)
    assert t.scores[["estimator", "n_runs", "n_configs"]].values.tolist() == [
        ["ppo_gae[update=clip]", 2, 1], ["ppo_gae[update=pg]", 2, 1]]
    assert t.runs.set_index("seed")["update"].to_dict() == {0: "clip", 1: "clip", 2: "pg", 3: "pg"}
    assert sorted(t.poi["x"]) == ["ppo_gae[update=clip]", "ppo_gae[update=pg]"]
    # the same frame with the labels stripped is relabelled, not pooled
    raw = t.metrics.assign(estimator=t.metrics["estimator_name"])
    assert compute_tables(raw, reps=50).scores["estimator"].tolist() == t.scores["estimator"].tolist()


def _pairs_by_hand(direct: pd.DataFrame) -> dict[tuple[str, str], float]:
    """P(X > Y) + ½ P(X = Y) over pairs of runs, per task, averaged over shared tasks."""
    out = {}
    ests = sorted(direct["estimator"].unique())
    for x in ests:
        for y in ests:
            if x == y:
                continue
            per_task = []
            for _, g in direct.groupby("task"):
                a = g.loc[g["estimator"] == x, "score"].to_numpy()
                b = g.loc[g["estimator"] == y, "score"].to_numpy()
                if len(a) and len(b):
                    per_task.append(np.mean([(u > v) + 0.5 * (u == v) for u in a for v in b]))
            out[x, y] = float(np.mean(per_task))
    return out


def test_report_reads_as_a_user_would(sweep, tmp_path):
    """Headline from the data with its rule and caveats; tables in the figures' order; each
    pair of estimators once; no paragraph twice."""
    assert main(["report", str(sweep), "--reps", "300", "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    direct = _direct_final_scores(sweep)
    head = md.split("## Headline\n", 1)[1].split("\n## ", 1)[0]
    assert md.index("## Headline") < md.index("## Runs")
    for task, g in direct.groupby("task"):
        iqm = g.groupby("estimator")["score"].apply(lambda s: scipy.stats.trim_mean(s, 0.25))
        assert f"- **{task}**: **{iqm.idxmax()}** has the highest IQM final score" in head
        # the final-score rows of a task go by IQM, best first, as its figure panel does
        rows = [line for line in _table_rows(md, "Final scores", (task,)) if "|" in line]
        assert [r.strip("|").split("|")[1].strip() for r in rows] == iqm.sort_values(ascending=False).index.tolist()
    n = direct.groupby(["task", "estimator"]).size()
    assert f"Caveats: {n.min()}–{n.max()} scored runs per estimator and task" in head
    assert "excludes 0.5" in head and "300 replicates" in head and "rough" in head
    # ppo_gae[gae_lambda=0.9] leads with one run per task: a point, so no lead of it is clear
    assert "its interval lies above" not in head and head.count("its lead over") == 2
    assert "a single run on a task has a point, not an interval" in head

    by_hand = _pairs_by_hand(direct)
    body = md.split("\n## Probability of improvement\n", 1)[1].split("\n## ", 1)[0]
    table = [line for line in body.splitlines() if line.startswith("| ") and not line.startswith(("| X", "| ---"))]
    pairs = [tuple(c.strip() for c in line.strip("|").split("|")[:2]) for line in table]
    assert len({frozenset(p) for p in pairs}) == len(pairs)       # each pair once
    for x, y in pairs:
        assert by_hand[x, y] > 0.5                                  # the better one first
    k = direct["estimator"].nunique()
    unordered = k * (k - 1) // 2
    other = unordered - len(pairs)
    assert (f"{other} of {unordered} pairs: the interval includes 0.5" in body) == (other > 0)

    prose = [line for line in md.splitlines() if line.strip() and not line.startswith(("|", "#", "!"))]
    assert len(prose) == len(set(prose))                            # no paragraph twice
    assert md.count("Diverged runs are") == 1


def test_figures_with_nothing_to_show_are_left_out(tmp_path):
    """No swept hyperparameter: no sensitivity figure, one line saying so; 5 runs per estimator:
    performance profiles drawn."""
    root = make_sweep(tmp_path / "res", estimators=("rloo", "reinforce"), seeds=(0, 1, 2, 3, 4))
    (root / "report").mkdir()
    (root / "report" / "sensitivity.png").write_bytes(b"stale")
    assert main(["report", str(root), "--reps", "100"]) == 0
    out = root / "report"
    md = (out / "report.md").read_text()
    assert not (out / "sensitivity.png").exists() and "sensitivity.png" not in md
    sens = md.split("\n## Sensitivity\n", 1)[1].split("\n## ", 1)[0].strip()
    assert sens.splitlines() == ["No hyperparameter among gamma, gae_lambda, clip_eps, kl_beta, n_steps, group_size, "
                                 "lr varies within an estimator × task, so there is no sensitivity figure."]
    assert (out / "performance_profiles.png").exists() and "](performance_profiles.png)" in md
