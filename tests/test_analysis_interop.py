"""rliable interop (analysis.interop, ``python -m analysis rliable``): score matrices
``{estimator: [runs x tasks]}`` of a small synthetic results folder, checked against values
worked out by hand from the evaluations written into it."""

from __future__ import annotations

import numpy as np
import pytest

from analysis import load, read_rliable_npz, rliable_scores, stats, write_rliable_npz
from analysis.report import compute_tables

from tests.analysis_fixtures import _summary, curve_columns, run_analysis_cli, write_run

A, C = "Acrobot-v1", "CartPole-v1"  # columns in this (sorted) order
SEEDS = (0, 2, 10)  # run directories sort seed0, seed10, seed2: rows must follow the seed
BASE = {(C, "ppo_gae"): 100.0, (C, "rloo"): 50.0, (A, "ppo_gae"): -200.0, (A, "rloo"): -300.0}


def evals(task: str, est: str, seed: int) -> list[float]:
    """8 iterations, evaluated at 2, 4, 6, 8: base + 10 seed + 0, 1, 2, 3."""
    b = BASE[(task, est)] + 10 * seed
    return [np.nan, b, np.nan, b + 1, np.nan, b + 2, np.nan, b + 3]


def make_folder(root, *, diverged_run=False, drop=None):
    for (task, est) in BASE:
        for seed in SEEDS:
            if drop == (task, est, seed):
                continue
            cols = curve_columns(task, est, seed, iterations=8, critic=False)
            cols["eval_return"] = evals(task, est, seed)
            status = "diverged" if diverged_run and (task, est, seed) == (C, "rloo", 10) else "completed"
            write_run(root / task / est / f"seed{seed}", cols, summary=_summary(f"{task}-{est}-{seed}", status, 8),
                      config=f"seed: {seed}\ntask:\n  name: {task}\nestimator:\n  name: {est}\n")
    return root


# final score = mean of the last 5 finite evaluations = all 4 of them = base + 10 seed + 1.5
PPO = np.array([[-198.5, 101.5], [-178.5, 121.5], [-98.5, 201.5]])
RLOO = np.array([[-298.5, 51.5], [-278.5, 71.5], [-198.5, 151.5]])


def test_matrices_are_runs_by_tasks_ordered_by_seed(tmp_path):
    scores = rliable_scores(make_folder(tmp_path))
    assert sorted(scores) == ["ppo_gae", "rloo"]
    np.testing.assert_array_equal(scores["ppo_gae"], PPO)
    np.testing.assert_array_equal(scores["rloo"], RLOO)
    assert scores["ppo_gae"].dtype == np.float64
    # a loaded frame gives the same; last_n=2: the mean of base + 2 and base + 3
    df = load(tmp_path)
    np.testing.assert_array_equal(rliable_scores(df)["rloo"], RLOO)
    np.testing.assert_array_equal(rliable_scores(df, last_n=2)["rloo"], RLOO + 1.0)
    # column order and selection
    np.testing.assert_array_equal(rliable_scores(df, tasks=[C])["ppo_gae"], PPO[:, [1]])
    np.testing.assert_array_equal(rliable_scores(df, tasks=[C, A])["ppo_gae"], PPO[:, ::-1])


def test_the_matrices_are_what_stats_and_the_report_compute_on(tmp_path):
    df = load(make_folder(tmp_path))
    scores = rliable_scores(df)
    # IQM of ppo_gae's 6 scores: drop the lowest and the highest, mean of the middle 4
    assert stats.aggregate_iqm(scores["ppo_gae"]) == pytest.approx((-178.5 - 98.5 + 101.5 + 121.5) / 4)
    t = compute_tables(df, reps=10)
    for r in t.scores.itertuples():
        column = scores[r.estimator][:, [A, C].index(r.task)]
        assert r.iqm == pytest.approx(stats.iqm(column)) and r.mean == pytest.approx(column.mean())


def test_diverged_rule_and_normalisation(tmp_path):
    df = load(make_folder(tmp_path, diverged_run=True))  # CartPole rloo seed 10 diverged
    # worst (default): the lowest evaluation any CartPole run logged, rloo seed 0's first: 50
    worst = rliable_scores(df)["rloo"]
    assert worst[2, 1] == 50.0 and worst[0, 1] == 51.5
    np.testing.assert_array_equal(rliable_scores(df, diverged="last")["rloo"], RLOO)  # its own evaluations
    # min-max within each task over both estimators (diverged="last"): Acrobot [-298.5, -98.5]
    # (span 200), CartPole [51.5, 201.5] (span 150)
    norm = rliable_scores(df, diverged="last", normalize=True)
    np.testing.assert_allclose(norm["ppo_gae"], [[100 / 200, 50 / 150], [120 / 200, 70 / 150], [1.0, 1.0]])
    np.testing.assert_allclose(norm["rloo"], [[0.0, 0.0], [20 / 200, 20 / 150], [100 / 200, 100 / 150]])


def test_ragged_is_refused_naming_the_counts_or_padded_with_nan(tmp_path):
    df = load(make_folder(tmp_path, drop=(A, "rloo", 10)))
    with pytest.raises(ValueError, match=r"^ragged must be 'nan' for this folder .*estimator rloo has scored runs "
                                         r"Acrobot-v1: 2, CartPole-v1: 3$"):
        rliable_scores(df)
    padded = rliable_scores(df, ragged="nan")["rloo"]
    np.testing.assert_array_equal(padded, [[-298.5, 51.5], [-278.5, 71.5], [np.nan, 151.5]])
    np.testing.assert_array_equal(rliable_scores(df, ragged="nan")["ppo_gae"], PPO)
    assert stats.aggregate_iqm(padded) == pytest.approx(stats.iqm([-298.5, 51.5, -278.5, 71.5, 151.5]))


@pytest.mark.parametrize("kwargs,message", [
    ({"ragged": "drop"}, r"^ragged must be one of \['error', 'nan'\], got 'drop'$"),
    ({"last_n": 0}, r"^last_n must be an integer >= 1, got 0$"),
    ({"diverged": "best"}, r"^diverged must be one of \['worst', 'last'\], got 'best'$"),
    ({"tasks": ["Pendulum-v1"]}, r"^tasks must be a non-empty list of tasks among \['Acrobot-v1', 'CartPole-v1'\]"),
])
def test_bad_arguments_name_themselves(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        rliable_scores(make_folder(tmp_path), **kwargs)


def test_npz_round_trip_and_plain_numpy_view(tmp_path):
    scores = {"ppo_gae": PPO, "rloo": RLOO}
    path = write_rliable_npz(tmp_path / "s.npz", scores, [A, C])
    got, tasks = read_rliable_npz(path)
    assert tasks == [A, C] and sorted(got) == ["ppo_gae", "rloo"]
    np.testing.assert_array_equal(got["rloo"], RLOO)
    with np.load(path, allow_pickle=False) as z:  # no pickles: numpy alone reads it
        assert sorted(z.files) == ["_tasks", "ppo_gae", "rloo"]
    with pytest.raises(ValueError, match=r"^scores\['x'\] must be \[runs x 2 tasks\], got shape \(3,\)"):
        write_rliable_npz(tmp_path / "t.npz", {"x": np.zeros(3)}, [A, C])
    with pytest.raises(ValueError, match=r"^estimator names must not be one of"):
        write_rliable_npz(tmp_path / "t.npz", {"_tasks": PPO}, [A, C])


def test_cli_writes_the_npz(tmp_path):
    root = make_folder(tmp_path / "res")
    r = run_analysis_cli("rliable", str(root), "--out", str(tmp_path / "m.npz"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["tasks (columns): Acrobot-v1, CartPole-v1", "  ppo_gae        3 runs x 2 tasks",
                                     "  rloo           3 runs x 2 tasks", f"rliable scores: {tmp_path / 'm.npz'}"]
    got, tasks = read_rliable_npz(tmp_path / "m.npz")
    assert tasks == [A, C]
    np.testing.assert_array_equal(got["ppo_gae"], PPO)
    np.testing.assert_array_equal(got["rloo"], RLOO)
    # default place, normalised
    r = run_analysis_cli("rliable", str(root), "--normalize", "--last-n", "2")
    assert r.returncode == 0, r.stderr
    got, _ = read_rliable_npz(root / "rliable_scores.npz")
    np.testing.assert_allclose(got["rloo"][:, 1], [0.0, 20 / 150, 100 / 150])


def test_cli_bad_input_is_one_line_exit_2(tmp_path):
    root = make_folder(tmp_path / "res", drop=(A, "rloo", 10))
    empty = tmp_path / "empty"
    empty.mkdir()
    prefix = "python -m analysis rliable: error: argument"
    cases = [
        (["--out", str(tmp_path / "m.txt")], f"{prefix} --out: {tmp_path / 'm.txt'} is not allowed; allowed: a file "
                                             "name ending in .npz (not an existing folder; created or replaced)"),
        (["--ragged", "drop"], f"{prefix} --ragged: invalid choice: 'drop' (choose from 'error', 'nan')"),
        (["--last-n", "0"], f"{prefix} --last-n: 0 is not allowed; allowed: an integer >= 1"),
        ([], "error: ragged must be 'nan' for this folder (rliable needs as many scored runs on every task): "
             "estimator rloo has scored runs Acrobot-v1: 2, CartPole-v1: 3"),
    ]
    for extra, line in cases:
        r = run_analysis_cli("rliable", str(root), *extra)
        assert r.returncode == 2 and r.stderr.splitlines() == [line], (extra, r.stderr)
        assert "Traceback" not in r.stderr
    r = run_analysis_cli("rliable", str(empty))
    assert r.returncode == 2 and r.stderr.splitlines() == ["error: no finished, scoreable run to put in a score matrix"]
    assert not list(tmp_path.rglob("*.npz"))  # nothing written
    r = run_analysis_cli("rliable", str(root), "--ragged", "nan")
    assert r.returncode == 0 and "  rloo           3 runs x 2 tasks, 1 NaN" in r.stdout.splitlines()


def test_rliable_itself_takes_the_matrices(tmp_path):
    """Optional: rliable 1.2.0 does not import with the pinned pandas (its arch<8 dependency
    fails), so this runs only where a working rliable is installed."""
    try:
        from rliable import library as rly
        from rliable import metrics
    except Exception as exc:  # ImportError, or arch's TypeError at import
        pytest.skip(f"rliable not usable here: {type(exc).__name__}: {exc}")
    scores = rliable_scores(make_folder(tmp_path))
    points, intervals = rly.get_interval_estimates(scores, lambda m: np.array([metrics.aggregate_iqm(m)]), reps=50)
    assert points["ppo_gae"][0] == pytest.approx(-13.5)
    assert intervals["ppo_gae"].shape == (2, 1)
