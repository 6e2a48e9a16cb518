"""rliable-style statistics against values worked out by hand (or by scipy directly)."""

import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis import stats
from analysis.stats import (
    aggregate_iqm,
    aggregate_mean,
    area_under_curve,
    final_scores,
    iqm,
    is_collapsed,
    performance_profile,
    probability_of_improvement,
    probability_of_improvement_interval,
    run_table,
    stratified_bootstrap,
)

# ----------------------------------------------------------------------------- IQM / mean


def test_iqm_of_one_to_eight_is_mean_of_middle_four():
    # n = 8: drop floor(8/4) = 2 at each end -> [3, 4, 5, 6] -> 4.5
    assert iqm(np.arange(1, 9)) == 4.5
    assert aggregate_iqm(np.arange(1, 9)[:, None]) == 4.5


def test_iqm_odd_count_and_outlier():
    # n = 5: drop floor(1.25) = 1 at each end -> [2, 3, 4] -> 3; the outlier 100 is ignored
    assert iqm([100, 2, 1, 4, 3]) == 3.0
    # n = 10: drop 2 each end of 0..9 -> [2..7] -> 4.5
    assert iqm(np.arange(10)) == 4.5


def test_aggregate_iqm_pools_runs_and_tasks_of_a_matrix():
    # runs x tasks; pooled [1,2,3,4,10,20,30,40] -> middle four [3,4,10,20] -> 9.25
    scores = np.array([[1, 10], [2, 20], [3, 30], [4, 40]], dtype=float)
    assert aggregate_iqm(scores) == 9.25
    # rliable's aggregate_mean: mean of task means (2.5 and 25) -> 13.75
    assert aggregate_mean(scores) == 13.75


def test_ragged_tasks_mean_of_task_means():
    scores = {"a": [1.0, 2.0, 3.0], "b": [10.0]}
    assert aggregate_mean(scores) == 6.0          # (2 + 10) / 2, not the pooled 4
    assert aggregate_iqm(scores) == 2.5           # pooled [1, 2, 3, 10] -> [2, 3]


def test_nan_scores_are_dropped():
    assert iqm([1.0, np.nan, 2.0, 3.0, 4.0]) == 2.5   # [1,2,3,4] -> [2,3]


# ----------------------------------------------------------------------------- bootstrap


def test_interval_contains_point_estimate():
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(10, 3))
    for statistic in ("iqm", "mean"):
        iv = stratified_bootstrap(scores, statistic, reps=500)
        assert iv.low <= iv.point <= iv.high
        assert iv.low < iv.high


def test_all_equal_scores_give_zero_width_interval():
    iv = stratified_bootstrap(np.full((6, 2), 3.25), "iqm", reps=200)
    assert iv.point == iv.low == iv.high == 3.25


def test_fixed_seed_is_reproducible():
    scores = np.random.default_rng(2).normal(size=(8, 2))
    a = stratified_bootstrap(scores, "iqm", reps=300, seed=7)
    b = stratified_bootstrap(scores, "iqm", reps=300, seed=7)
    c = stratified_bootstrap(scores, "iqm", reps=300, seed=8)
    assert a == b
    assert (a.low, a.high) != (c.low, c.high)


def test_two_run_mean_interval_by_hand():
    # One task, runs [0, 1]: the bootstrap mean is 0 (p=1/4), 0.5 (1/2) or 1 (1/4), so
    # the 2.5% and 97.5% percentiles are 0 and 1.
    iv = stratified_bootstrap([np.array([0.0, 1.0])], "mean", reps=2000)
    assert iv == (0.5, 0.0, 1.0)


def test_stratification_keeps_each_task_its_own_runs():
    seen = []

    def record(tasks):
        seen.append([t.copy() for t in tasks])
        return np.mean(np.concatenate(tasks, axis=1), axis=1)

    stratified_bootstrap({"a": [1.0, 2.0, 3.0], "b": [100.0, 200.0]}, record, reps=50)
    point_call, boot_call = seen
    assert [t.shape for t in point_call] == [(1, 3), (1, 2)]
    assert [t.shape for t in boot_call] == [(50, 3), (50, 2)]
    assert set(np.unique(boot_call[0])) <= {1.0, 2.0, 3.0}
    assert set(np.unique(boot_call[1])) <= {100.0, 200.0}


def test_stratification_by_value():
    # Each task is constant, so a stratified resample never changes the mean of task means
    # (0.5); a pooled bootstrap of [0, 0, 1, 1] would give a wide interval.
    iv = stratified_bootstrap(np.array([[0.0, 1.0], [0.0, 1.0]]), "mean", reps=500)
    assert iv == (0.5, 0.5, 0.5)


# ----------------------------------------------------------------------------- improvement


def test_probability_of_improvement_by_hand():
    # pairs (1,0) win, (1,3) lose, (2,0) win, (2,3) lose -> 2/4
    assert probability_of_improvement([np.array([1.0, 2.0])], [np.array([0.0, 3.0])]) == 0.5


def test_ties_count_half():
    assert probability_of_improvement([np.array([1.0, 1.0])], [np.array([1.0, 1.0])]) == 0.5
    # pairs (1,1) tie -> 0.5, (2,1) win -> 1: mean 0.75
    assert probability_of_improvement([np.array([1.0, 2.0])], [np.array([1.0])]) == 0.75


def test_probability_of_improvement_averages_over_shared_tasks():
    x = {"a": [1.0, 2.0], "b": [5.0], "only_x": [99.0]}
    y = {"a": [0.0, 3.0], "b": [4.0]}
    assert probability_of_improvement(x, y) == pytest.approx((0.5 + 1.0) / 2)


def test_probability_of_improvement_matches_mann_whitney_u():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 5, size=(7, 3)).astype(float)   # integers: plenty of ties
    y = rng.integers(0, 5, size=(5, 3)).astype(float)
    expected = np.mean([scipy.stats.mannwhitneyu(x[:, m], y[:, m], alternative="greater")[0]
                        / (7 * 5) for m in range(3)])
    assert probability_of_improvement(x, y) == pytest.approx(expected)


def test_probability_of_improvement_interval():
    iv = probability_of_improvement_interval([np.array([5.0, 6.0, 7.0])], [np.array([1.0, 2.0])],
                                             reps=200)
    assert iv == (1.0, 1.0, 1.0)   # X beats Y in every resample
    rng = np.random.default_rng(4)
    iv = probability_of_improvement_interval(rng.normal(size=(6, 2)), rng.normal(size=(6, 2)),
                                             reps=400)
    assert 0 <= iv.low <= iv.point <= iv.high <= 1


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=6),
       st.lists(st.integers(-3, 3), min_size=1, max_size=6))
def test_improvement_of_x_over_y_and_y_over_x_sum_to_one(x, y):
    x, y = [np.array(x, float)], [np.array(y, float)]
    assert probability_of_improvement(x, y) + probability_of_improvement(y, x) == pytest.approx(1.0)


# ----------------------------------------------------------------------------- profiles


def test_performance_profile_by_hand():
    prof = performance_profile([np.array([1.0, 2.0, 3.0, 4.0])], [0.0, 1.0, 2.5, 4.0], reps=200)
    # strictly above tau: 4/4, 3/4 (tau = 1 itself does not count), 2/4, 0/4
    assert prof["fraction"].tolist() == [1.0, 0.75, 0.5, 0.0]
    assert (prof["low"] <= prof["fraction"]).all() and (prof["fraction"] <= prof["high"]).all()
    # tau = 0 and tau = 4: every resample gives 1 and 0 -> zero-width bands
    assert prof.loc[0, ["low", "high"]].tolist() == [1.0, 1.0]
    assert prof.loc[3, ["low", "high"]].tolist() == [0.0, 0.0]


def test_performance_profile_averages_tasks():
    prof = performance_profile({"a": [1.0, 2.0], "b": [10.0, 20.0, 30.0, 40.0]}, [15.0], reps=50)
    assert prof["fraction"].iloc[0] == pytest.approx((0.0 + 0.75) / 2)


def test_fraction_above_counts_values_strictly_above_each_tau():
    """By hand (NaN is never above; a tie is not above), then against the comparison it
    replaces on draws with ties, NaN and infinities."""
    from analysis.stats import fraction_above
    got = fraction_above(np.array([[1.0, 2.0, 2.0, np.nan], [np.inf, -np.inf, 0.0, 0.0]]), [0.0, 1.5, 2.0])
    np.testing.assert_array_equal(got, [[0.75, 0.5, 0.0], [0.25, 0.25, 0.25]])
    rng = np.random.default_rng(0)
    draws = rng.integers(-3, 4, size=(50, 30)).astype(float)
    draws[rng.random(draws.shape) < 0.1] = np.nan
    draws[rng.random(draws.shape) < 0.05] = np.inf
    draws[rng.random(draws.shape) < 0.05] = -np.inf
    taus = np.array([-np.inf, -3.0, -0.5, 0.0, 2.0, 3.0, np.inf])
    np.testing.assert_array_equal(fraction_above(draws, taus), (draws[:, :, None] > taus).mean(axis=1))


# ----------------------------------------------------------------------------- per run


def test_area_under_curve_by_hand():
    # trapezoid: 0.5*50*10 + 50*10 = 750 over a budget of 100
    assert area_under_curve([0, 50, 100], [0, 10, 10], 100) == 7.5
    # held at 10 on [0, 50] (500), trapezoid to 20 on [50, 100] (750), held 20 on [100, 200] (2000)
    assert area_under_curve([100, 50], [20, 10], 200) == pytest.approx(3250 / 200)
    assert np.isnan(area_under_curve([], [], 100))


def test_collapse_rule():
    assert not is_collapsed([0, 10, 100, 60])    # stays above half of its best (50)
    assert is_collapsed([0, 10, 100, 40])
    assert is_collapsed([100, 40])
    assert not is_collapsed([40, 100])           # the drop must come after the best
    assert not is_collapsed([0, 0, 0])           # never above the floor
    # negative returns, shifted by the task minimum -500: s = [0, 400, 100] -> collapsed
    assert is_collapsed([-500, -100, -400], shift=-500)
    assert not is_collapsed([-500, -100, -250], shift=-500)   # s = 250 >= 200


def test_final_scores_mean_of_last_evaluations_with_fallback():
    df = pd.DataFrame({
        "run_dir": ["r1"] * 5 + ["r2"] * 3,
        "seed": [0.0] * 8,
        "task": ["t"] * 8,
        "estimator": ["e"] * 8,
        "status": ["completed"] * 8,
        "iteration": [4, 3, 2, 1, 0, 0, 1, 2],          # r1 rows out of order on purpose
        "eval_return": [np.nan, 9.0, np.nan, 5.0, 1.0, np.nan, np.nan, np.nan],
        "episode_return": [0.0] * 5 + [1.0, 2.0, 4.0],
    })
    out = final_scores(df, last_n=2).set_index("run_dir")
    assert out.loc["r1", "score"] == 7.0                    # evals 5 (it 1), 9 (it 3)
    assert out.loc["r1", "score_source"] == "eval_return"
    assert out.loc["r2", "score"] == 3.0                    # no eval: episode returns 2, 4
    assert out.loc["r2", "score_source"] == "episode_return"


def test_run_table_sorts_a_runs_rows_by_iteration_when_they_are_not_in_order():
    """Rows in order (as load gives them) are used as they are; the same rows reversed give the
    same table (score, AUC over env_steps, collapse flag)."""
    df = _runs(("a", "completed", [0, 10, 20, 30], [0.0, 4.0, 8.0, 8.0], np.nan),
               ("b", "completed", [0, 10, 20, 30], [5.0, 1.0, 0.0, 0.0], np.nan))
    ordered = run_table(df, last_n=2).set_index("run_dir")
    assert ordered.loc["a", "score"] == 8.0 and ordered.loc["b", "score"] == 0.0
    # AUC by hand (trapezoids over 0..30, divided by 30): a (20 + 60 + 80) / 30, b (30 + 5) / 30
    assert ordered.loc["a", "auc"] == pytest.approx(160 / 30) and ordered.loc["b", "auc"] == pytest.approx(35 / 30)
    reversed_ = run_table(df.iloc[::-1].reset_index(drop=True), last_n=2).set_index("run_dir")
    pd.testing.assert_frame_equal(reversed_.sort_index(), ordered.sort_index())


# ----------------------------------------------------------------------------- diverged runs


def _runs(*runs) -> pd.DataFrame:
    """A loaded frame by hand: one ``(run_dir, status, env_steps, eval_return, worst_return)``
    per run, one row per point; task ``t``, seed 0, no hyperparameters."""
    rows = []
    for run_dir, status, xs, ys, worst in runs:
        for i, (x, y) in enumerate(zip(xs, ys)):
            rows.append({"run_dir": run_dir, "seed": 0.0, "task": "t", "estimator": "e", "status": status,
                         "iteration": i + 1, "env_steps": float(x), "eval_return": float(y),
                         "episode_return": np.nan, "worst_return": worst})
    df = pd.DataFrame(rows)
    for col in stats.HYPERPARAMETERS:
        df[col] = np.nan
    return df


def test_area_under_curve_stops_at_divergence_by_hand():
    # 10, 20 at x = 0, 50: trapezoid 0.5 * (10 + 20) * 50 = 750 on [0, 50]
    assert area_under_curve([0, 50], [10, 20], 100) == 17.5                        # + 20 * 50 held
    assert area_under_curve([0, 50], [10, 20], 100, stop=50, after=0.0) == 7.5     # + 0 * 50
    assert area_under_curve([0, 50], [10, 20], 100, stop=50, after=-4.0) == 5.5    # (750 - 200) / 100
    # the last value is held from the last point to the divergence: 750 + 20 * 30 + 0 * 20
    assert area_under_curve([0, 50], [10, 20], 100, stop=80, after=0.0) == 13.5


def test_diverged_run_under_both_rules_by_hand():
    # d: evaluations 10, 20 at x = 0, 50, diverged after x = 50 (its last row), worst return 0;
    # c: completed, 0, 20, 40 at x = 0, 50, 100 fixes the budget at 100.
    df = _runs(("d", "diverged", [0, 50], [10, 20], 0.0),
               ("c", "completed", [0, 50, 100], [0, 20, 40], 0.0))
    worst = run_table(df, last_n=5).set_index("run_dir")               # the default rule
    assert (worst.loc["d", "budget"], worst.loc["d", "score"], worst.loc["d", "auc"]) == (100, 0.0, 7.5)
    assert worst.loc["d", "worst_source"] == "task.worst_return"
    last = run_table(df, last_n=5, diverged="last").set_index("run_dir")
    assert last.loc["d", "score"] == 15.0                              # mean of 10, 20
    assert last.loc["d", "auc"] == 17.5                                # (750 + 20 * 50) / 100
    # the run that did not diverge scores the same under both rules, and as before
    for table in (worst, last):
        assert table.loc["c", "score"] == 20.0                          # mean of 0, 20, 40
        assert table.loc["c", "auc"] == 20.0                            # (500 + 1500) / 100
        assert np.isnan(table.loc["c", "worst_return"])
    assert final_scores(df, last_n=2).set_index("run_dir")["score"].tolist() == [30.0, 0.0]
    assert final_scores(df, last_n=2, diverged="last").set_index("run_dir")["score"].tolist() == [30.0, 15.0]
    # a run that diverged before it logged any score: the worst return throughout, or unscored
    n = pd.concat([df, _runs(("n", "diverged", [10], [np.nan], -1.0))], ignore_index=True)
    assert run_table(n).set_index("run_dir").loc["n", ["score", "auc"]].tolist() == [-1.0, -1.0]
    assert run_table(n, diverged="last").set_index("run_dir").loc["n", ["score", "auc"]].isna().all()


def test_diverged_run_without_worst_return_falls_back_to_the_lowest_observed():
    # d recorded no worst return (an older run): the lowest eval_return among all runs of
    # task t is -3 (run c, a completed run); a run of another task does not count.
    df = _runs(("d", "diverged", [0, 50], [10, 20], np.nan),
               ("c", "completed", [0, 50, 100], [-3, 20, 40], np.nan))
    other = _runs(("o", "completed", [0, 100], [-99, -99], np.nan)).assign(task="other")
    table = run_table(pd.concat([df, other], ignore_index=True)).set_index("run_dir")
    assert table.loc["d", "score"] == -3.0
    assert table.loc["d", "worst_return"] == -3.0 and table.loc["d", "worst_source"] == "lowest observed"
    assert table.loc["d", "auc"] == pytest.approx((750 - 3 * 50) / 100)
    assert table.loc["c", "score"] == 19.0 and table.loc["o", "score"] == -99.0


def test_diverged_rule_must_be_worst_or_last():
    df = _runs(("c", "completed", [0, 100], [1, 2], np.nan))
    for fn in (final_scores, run_table):
        with pytest.raises(ValueError, match=r"diverged must be one of \['worst', 'last'\], got 'best'"):
            fn(df, diverged="best")


def test_normalize_by_task():
    runs = pd.DataFrame({"task": ["a", "a", "a", "b", "b"], "score": [0.0, 5.0, 10.0, -4.0, -4.0]})
    assert stats.normalize_by_task(runs).tolist() == [0.0, 0.5, 1.0, 0.5, 0.5]


# ----------------------------------------------------------------------------- curve bands


def _curve_frame() -> pd.DataFrame:
    """Three runs of one task/estimator: a repeated x (the later row counts), a shorter range,
    and a single evaluation."""
    rows = [("c", 2, 19.0, 7.0),
            ("b", 1, 10.0, 10.0), ("b", 1, 0.0, 10.0),
            ("a", 0, 20.0, 5.0), ("a", 0, 0.0, 0.0), ("a", 0, 20.0, 20.0)]
    df = pd.DataFrame(rows, columns=["run_dir", "seed", "env_steps", "eval_return"])
    return df.assign(task="T", estimator="E")


def test_curve_bands_mean_by_hand():
    # grid 0, 10, 20 (n_grid=3, xmax 20). Run a: 0 -> 0, 20 -> 20 (its later row at x=20), so
    # 10 at x=10 (5 if the earlier row at x=20 counted).
    # Run b: 10 at 0 and 10, not logged at 20. Run c: one point at x=19, on grid point 20.
    bands = stats.curve_bands(_curve_frame(), "eval_return", n_grid=3, reps=200, seed=0)
    assert bands["x"].tolist() == [0.0, 10.0, 20.0]
    np.testing.assert_allclose(bands["mean"], [5.0, 10.0, 13.5])
    assert bands["n_runs"].tolist() == [2, 2, 2]
    # every resample of runs {a, b} at x=10 has mean 10: a zero-width band there
    assert bands["low"].iloc[1] == pytest.approx(10.0) and bands["high"].iloc[1] == pytest.approx(10.0)


def test_curve_bands_band_is_the_bootstrap_of_run_means():
    """The band against a direct reading of the docstring: the same resamples of runs (the
    same generator draws), the mean over each resample's runs at every grid point."""
    rng = np.random.default_rng(11)
    rows = []
    for r in range(7):
        xs = np.sort(rng.choice(np.arange(0, 100, 5), size=rng.integers(1, 8), replace=False)).astype(float)
        rows += [(f"run{r}", r, x, float(rng.normal())) for x in xs]
    df = pd.DataFrame(rows, columns=["run_dir", "seed", "env_steps", "eval_return"]).assign(task="T", estimator="E")
    n_grid, reps, seed = 9, 300, 5
    got = stats.curve_bands(df, "eval_return", n_grid=n_grid, reps=reps, seed=seed)

    grid = np.linspace(0.0, df["env_steps"].max(), n_grid)
    curves = []
    for _, run in df.groupby(["run_dir", "seed"], sort=True):
        xs, ys = run["env_steps"].to_numpy(), run["eval_return"].to_numpy()
        c = np.full(n_grid, np.nan)
        if len(xs) == 1:
            c[np.argmin(np.abs(grid - xs[0]))] = ys[0]
        else:
            inside = (grid >= xs[0]) & (grid <= xs[-1])
            c[inside] = np.interp(grid[inside], xs, ys)
        curves.append(c)
    curves = np.asarray(curves)
    idx = np.random.default_rng(seed).integers(0, len(curves), size=(reps, len(curves)))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # grid points a resample does not cover
        boot = np.nanmean(curves[idx], axis=1)
        lo, hi = np.nanpercentile(boot, [2.5, 97.5], axis=0)
    keep = np.isfinite(curves).any(axis=0)
    np.testing.assert_allclose(got["mean"], np.nanmean(curves[:, keep], axis=0))
    np.testing.assert_allclose(got["low"], lo[keep])
    np.testing.assert_allclose(got["high"], hi[keep])
