"""The report's figures: one colour per estimator whatever the sweep, comparison rows by score,
a second encoding (marker, line style, hatch) for the setting that splits an estimator's runs.
Values are read back from the matplotlib artists of the drawn figures."""

import os
import subprocess
import sys
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from analysis import figures as figs
from harness.estimators.registry import estimator_names

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plot functions draw, kept instead of only saved."""
    kept = []
    monkeypatch.setattr(figs, "_save", lambda fig, path: kept.append(fig) or Path(path))
    return kept


def _scores(rows: dict[tuple[str, str], float]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A report's score table ((task, label) -> IQM, interval +-0.05) and its runs (3 per row)."""
    table = pd.DataFrame([{"task": t, "estimator": e, "iqm": v, "iqm_low": v - 0.05, "iqm_high": v + 0.05}
                          for (t, e), v in rows.items()])
    runs = pd.DataFrame([{"task": t, "estimator": e, "score": v + d}
                         for (t, e), v in rows.items() for d in (-0.02, 0.0, 0.02)])
    return table, runs


def _final_scores(drawn, rows, tmp_path, **kw):
    table, runs = _scores(rows)
    figs.plot_final_scores(table, runs, tmp_path / "f.png", figs.estimator_palette(table["estimator"]), **kw)
    return drawn.pop()


def _points(ax) -> dict[str, tuple[float, str, str]]:
    """Row label -> (x, colour, marker) of the point estimate drawn on that row."""
    labels = [t.get_text() for t in ax.get_yticklabels()]
    out = {}
    for line in ax.lines:
        x, y = line.get_xdata(), line.get_ydata()
        if len(x) == 1 and line.get_marker() not in (None, "None", "", "|"):
            out[labels[int(round(y[0]))]] = (float(x[0]), to_hex(line.get_color()), line.get_marker())
    return out


def _tab10(name: str) -> str:
    # worked out apart from ESTIMATOR_COLORS: matplotlib's tab10 by registration order
    return to_hex(matplotlib.colormaps["tab10"].colors[estimator_names().index(name)])


def test_estimator_colour_is_the_same_in_figures_of_different_sweeps(drawn, tmp_path):
    """grpo alone in one sweep and split by policy loss in another has grpo's colour in both,
    in the final scores and in the curves; every estimator's colour follows the registry."""
    a = _final_scores(drawn, {("cartpole", "grpo"): 0.8, ("cartpole", "rloo"): 0.6}, tmp_path)
    b = _final_scores(drawn, {("lm", "grpo[update=clip]"): 0.4, ("lm", "grpo[update=gspo]"): 0.5,
                              ("lm", "a2c"): 0.3, ("lm", "reinforce"): 0.2}, tmp_path)
    pa, pb = _points(a.axes[0]), _points(b.axes[0])
    assert set(pa) == {"grpo", "rloo"} and set(pb) == {"grpo[update=clip]", "grpo[update=gspo]", "a2c", "reinforce"}
    assert pa["grpo"][1] == pb["grpo[update=clip]"][1] == pb["grpo[update=gspo]"][1] == _tab10("grpo")
    assert pa["rloo"][1] == _tab10("rloo") and pb["a2c"][1] == _tab10("a2c")
    assert pb["reinforce"][1] == _tab10("reinforce")
    # the tick labels carry the same colour
    assert {t.get_text(): to_hex(t.get_color()) for t in b.axes[0].get_yticklabels()}["grpo[update=gspo]"] \
        == _tab10("grpo")

    # a third figure of the second sweep: performance profiles, lines per label
    taus = np.linspace(0, 1, 5)
    prof = pd.concat([pd.DataFrame({"panel": "lm", "estimator": e, "tau": taus, "fraction": 1 - taus,
                                    "low": 0.9 - taus, "high": 1.1 - taus})
                      for e in ("grpo[update=clip]", "grpo[update=gspo]", "a2c")])
    figs.plot_performance_profiles(prof, tmp_path / "p.png", figs.estimator_palette(prof["estimator"]))
    colours = {to_hex(line.get_color()) for line in drawn.pop().axes[0].lines}
    assert colours == {_tab10("grpo"), _tab10("a2c")}


def test_final_scores_rows_by_score_best_first(drawn, tmp_path):
    """Rows come out by the IQM shown, highest on top, per panel, whatever the alphabet says."""
    rows = {("cartpole", "a2c"): 0.5, ("cartpole", "grpo"): 0.7, ("cartpole", "rloo"): 0.9,
            ("acrobot", "a2c"): 0.9, ("acrobot", "grpo"): 0.1, ("acrobot", "rloo"): 0.4}
    fig = _final_scores(drawn, rows, tmp_path)
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_yticklabels()}
    top_to_bottom = {}
    for title, ax in panels.items():
        lo, hi = ax.get_ylim()
        assert lo > hi  # the y axis runs downwards: position 0 on top
        top_to_bottom[title] = [t.get_text() for t in ax.get_yticklabels()]
        # each row's point sits at its own IQM
        assert {k: v[0] for k, v in _points(ax).items()} == {e: v for (t, e), v in rows.items() if t == title}
    assert top_to_bottom == {"cartpole": ["rloo", "grpo", "a2c"], "acrobot": ["a2c", "rloo", "grpo"]}


def test_score_order_ties_and_missing_scores():
    t = pd.DataFrame({"estimator": ["c", "b", "a", "d"], "iqm": [0.5, np.nan, 0.5, 0.9]})
    assert figs.score_order(t) == ["d", "a", "c", "b"]


def test_probability_of_improvement_rows_by_mean(drawn, tmp_path):
    p = {("a2c", "rloo"): 0.1, ("a2c", "grpo"): 0.3, ("rloo", "a2c"): 0.9, ("rloo", "grpo"): 0.6,
         ("grpo", "a2c"): 0.7, ("grpo", "rloo"): 0.4}   # means: rloo 0.75, grpo 0.55, a2c 0.2
    poi = pd.DataFrame([{"x": x, "y": y, "n_tasks": 1, "p": v, "low": v, "high": v} for (x, y), v in p.items()])
    figs.plot_probability_of_improvement(poi, tmp_path / "poi.png", figs.estimator_palette(["a2c", "rloo", "grpo"]),
                                         n_tasks=1)
    ax = drawn.pop().axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rloo", "grpo", "a2c"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["rloo", "grpo", "a2c"]


def test_second_encoding_tells_the_policy_losses_apart(drawn, tmp_path):
    """Two policy losses of one estimator: same colour, different marker (points), line style
    (curves) and hatch (bars), each with a legend naming the setting."""
    fig = _final_scores(drawn, {("lm", "grpo[update=clip]"): 0.4, ("lm", "grpo[update=gspo]"): 0.5}, tmp_path)
    pts = _points(fig.axes[0])
    clip, gspo = pts["grpo[update=clip]"], pts["grpo[update=gspo]"]
    assert clip[1] == gspo[1] and clip[2] != gspo[2]
    (legend,) = fig.legends
    assert "update" in legend.get_title().get_text()
    assert sorted(t.get_text() for t in legend.get_texts()) == ["clip", "gspo"]
    assert sorted(h.get_marker() for h in legend.legend_handles) == sorted([clip[2], gspo[2]])

    taus = np.linspace(0, 1, 5)
    prof = pd.concat([pd.DataFrame({"panel": "lm", "estimator": e, "tau": taus, "fraction": 1 - taus,
                                    "low": 0.9 - taus, "high": 1.1 - taus})
                      for e in ("grpo[update=clip]", "grpo[update=gspo]")])
    figs.plot_performance_profiles(prof, tmp_path / "p.png", figs.estimator_palette(prof["estimator"]))
    fig = drawn.pop()
    styles = {line.get_linestyle() for line in fig.axes[0].lines}
    assert len(styles) == 2
    (legend,) = fig.legends
    assert "update" in legend.get_title().get_text()
    assert len({h.get_linestyle() for h in legend.legend_handles}) == 2

    counts = pd.DataFrame({"estimator": ["grpo[update=clip]", "grpo[update=gspo]"], "n_runs": [3, 3],
                           "diverged": [1, 2], "collapsed": [0, 1]})
    figs.plot_failure_counts(counts, tmp_path / "c.png", figs.estimator_palette(counts["estimator"]))
    fig = drawn.pop()
    bars = [b for b in fig.axes[0].patches if b.get_height() > 0]
    assert len(bars) == 2 and bars[0].get_hatch() != bars[1].get_hatch()
    assert to_hex(bars[0].get_facecolor()) == to_hex(bars[1].get_facecolor()) == _tab10("grpo")


def test_one_setting_draws_no_second_legend(drawn, tmp_path):
    fig = _final_scores(drawn, {("lm", "grpo"): 0.4, ("lm", "rloo"): 0.5}, tmp_path)
    assert fig.legends == []
    assert {v[2] for v in _points(fig.axes[0]).values()} == {"o"}


def test_unknown_estimator_colour_is_stable_and_free():
    """A name outside the registry (a plugin's estimator) takes a colour no registered estimator
    has (while the palette has free ones), the same in another process with another hash seed."""
    name = "my_plugin_median"
    taken = {figs.estimator_color(n) for n in estimator_names()}
    c = figs.estimator_color(name)
    assert c in figs.PLUGIN_COLORS + figs.ESTIMATOR_COLORS
    if len(estimator_names()) < len(figs.ESTIMATOR_COLORS):
        assert c not in taken
    assert figs.estimator_color(f"{name}[update=gspo]") == c
    names = [name] + [f"plugin_{i}" for i in range(8)]
    here = [figs.estimator_color(n) for n in names]
    code = f"from analysis.figures import estimator_color; print([estimator_color(n) for n in {names!r}])"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout.strip()
    assert out == repr(here)


def test_plugins_take_the_free_colours_in_turn():
    """Names outside the registry take the free colours (the plugins' own, then the registry's
    unused ones) in sorted order: as many distinct colours as there are free ones, none a
    registered estimator's."""
    registered = estimator_names()
    free = figs.PLUGIN_COLORS + figs.ESTIMATOR_COLORS[len(registered):]
    assert not set(figs.PLUGIN_COLORS) & set(figs.ESTIMATOR_COLORS)  # picked apart from the registry's
    plugins = [f"plugin_{i}" for i in range(len(free))]
    palette = figs.estimator_palette([*plugins, "grpo", f"{plugins[0]}[update=gspo]"])
    assert [palette[p] for p in sorted(plugins)] == list(free)
    assert palette[f"{plugins[0]}[update=gspo]"] == palette[plugins[0]]
    assert palette["grpo"] == figs.ESTIMATOR_COLORS[registered.index("grpo")]


def _claim_data(arms: dict[str, str]) -> tuple[object, dict]:
    """A training claim whose arms (tag -> estimator) run 3 seeds x 3 evaluations of column v."""
    import types

    from analysis.claims.evidence import ExpData
    rows, sweep = [], []
    for tag, est in arms.items():
        for seed in range(3):
            rd = f"x/{tag}/seed{seed}"
            sweep.append({"run_dir": rd, "arm": tag})
            rows += [{"run_dir": rd, "seed": seed, "iteration": it, "estimator": est, "env_steps": 100 * it,
                      "v": it + seed} for it in (1, 2, 3)]
    e = ExpData("x", pd.DataFrame({"run_dir": [s["run_dir"] for s in sweep], "status": "completed"}),
                pd.DataFrame(), pd.DataFrame(), pd.DataFrame(rows), pd.DataFrame(sweep))
    ps = types.SimpleNamespace(stat="run_metric", experiment="x",
                               args={"metric": {"column": "v"}, **{t: {"arm": t} for t in arms}})
    return types.SimpleNamespace(primary=ps), {"x": e}


@pytest.mark.parametrize("arms", [{"a": "ppo_gae", "b": "ppo_gae"}, {"a": "grpo", "b": "reinforce"}])
def test_claim_curves_take_the_estimator_colour_and_tell_the_arms_apart(arms):
    """A claim's arms are drawn in their estimator's colour, as in the report, apart by line style."""
    from matplotlib.figure import Figure

    from analysis.claims.figures import _curve_panel
    claim, data = _claim_data(arms)
    ax = Figure().subplots()
    assert _curve_panel(ax, claim, data)
    lines = {line.get_label().split(":")[0]: line for line in ax.lines}
    assert {t: to_hex(lines[t].get_color()) for t in arms} == {t: _tab10(e) for t, e in arms.items()}
    assert lines["a"].get_linestyle() != lines["b"].get_linestyle()


def test_titles_words_and_count_ticks(drawn, tmp_path):
    """The final-score title says what a final score is; the probability-of-improvement axes say
    "estimator"; failure bars keep the table's order (by score) on whole-run ticks."""
    fig = _final_scores(drawn, {("lm", "grpo"): 0.4, ("lm", "rloo"): 0.5}, tmp_path, last_n=5)
    assert fig.get_suptitle().startswith(
        "Final score: IQM over runs of each run's mean of its last 5 evaluations, 95% CI")

    poi = pd.DataFrame([{"x": x, "y": y, "n_tasks": 1, "p": p, "low": p, "high": p}
                        for x, y, p in (("grpo", "rloo", 0.2), ("rloo", "grpo", 0.8))])
    figs.plot_probability_of_improvement(poi, tmp_path / "poi.png", figs.estimator_palette(["grpo", "rloo"]),
                                         n_tasks=1)
    ax = drawn.pop().axes[0]
    words = " ".join([ax.get_xlabel(), ax.get_ylabel(), ax.get_title()])
    assert "algorithm" not in words and ax.get_xlabel().startswith("estimator") \
        and ax.get_ylabel().startswith("estimator")

    counts = pd.DataFrame({"estimator": ["rloo", "grpo", "a2c"], "n_runs": [3, 3, 3],
                           "diverged": [0, 1, 0], "collapsed": [1, 0, 0]})
    figs.plot_failure_counts(counts, tmp_path / "c.png", figs.estimator_palette(counts["estimator"]))
    fig = drawn.pop()
    for ax in fig.axes[:2]:
        assert [t.get_text() for t in ax.get_xticklabels()] == ["rloo", "grpo", "a2c"]
        ticks = [v for v in ax.get_yticks() if 0 <= v <= ax.get_ylim()[1]]
        assert ticks and all(float(v).is_integer() for v in ticks), ticks


def test_curve_titles_name_the_axis_drawn(drawn, tmp_path):
    """A task that logs tokens is drawn against tokens: the title says so, not environment steps."""
    rows = [{"task": "toy", "estimator": "grpo", "run_dir": f"r{s}", "seed": s, "iteration": i,
             "env_steps": 100 * i, "tokens": 300 * i, "eval_return": 0.1 * i + s, "episode_return": 0.1 * i}
            for s in (0, 1) for i in range(1, 6)]
    df = pd.DataFrame(rows)
    figs.plot_learning_curves(df, tmp_path / "lc.png", figs.estimator_palette(["grpo"]), figs.Curves(reps=20))
    fig = drawn.pop()
    assert fig.get_suptitle().startswith("Learning curves vs sampled tokens")
    assert fig.axes[0].get_xlabel() == "sampled tokens"


def test_a_claims_batch_panel_names_what_differs_and_the_rule_lines_are_named():
    """The box plots of a probe claim are labelled by the settings its two configs differ in (the
    shared ones said once would overlap at the figure's width), with n; the primary's rule lines
    carry their names in a legend (threshold, smallest effect that counts, interval, estimate)."""
    import types

    from matplotlib.figure import Figure

    from analysis.claims.evidence import ExpData
    from analysis.claims.figures import _batch_panel, _interval_axis
    from analysis.claims.rules import Rule

    shared = {"probe.negative_control": False, "reference": None}
    batches = pd.DataFrame([{"estimator": est, "scope": "all", "dev_sq": float(i), **shared}
                            for est in ("baseline", "reinforce") for i in range(4)])
    e = ExpData("x", pd.DataFrame(), pd.DataFrame(), batches, pd.DataFrame(), pd.DataFrame())
    ps = types.SimpleNamespace(stat="batch_ratio", experiment="x", args={
        "num": {"estimator": "baseline", **shared}, "den": {"estimator": "reinforce", **shared}})
    ax = Figure().subplots()
    assert _batch_panel(ax, types.SimpleNamespace(primary=ps), {"x": e})
    assert [t.get_text() for t in ax.get_xticklabels()] == ["estimator=baseline\n(n=4)", "estimator=reinforce\n(n=4)"]
    part = types.SimpleNamespace(point=0.5, low=0.4, high=0.6, verdict="supported", role="primary", name="ratio",
                                 rule="< 1 by 0.1", level=0.95, spec=Rule.parse({"less": {"than": 1, "by": 0.1}}))
    ax = Figure().subplots()
    _interval_axis(ax, part)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "threshold", "smallest effect that counts", "interval", "estimate"]
