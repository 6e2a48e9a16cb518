"""Loader on synthetic results folders: schema drift, diverged, corrupt and incomplete runs."""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from tests.analysis_fixtures import _summary, curve_columns, write_run

import analysis
from analysis import AnalysisWarning

TASK = "CartPole-v1"


def _cols(est, seed, iterations=6, **kw):
    return curve_columns(TASK, est, seed, iterations=iterations, eval_every=2, **kw)


def test_differing_columns_are_null_filled_and_types_promoted(tmp_path):
    new = _cols("ppo_gae", 0)                                # has value_loss, entropy...
    old = {k: v for k, v in _cols("rloo", 1, critic=False).items()
           if k not in ("entropy", "gae_lambda", "approx_kl")}
    old["env_steps"] = np.asarray(old["env_steps"], dtype=float)   # float where new has int
    old["legacy_metric"] = np.arange(6.0)                    # a column only the old run has
    write_run(tmp_path / TASK / "ppo_gae" / "s0", new, summary=_summary("a", "completed", 6))
    write_run(tmp_path / TASK / "rloo" / "s1", old, summary=_summary("b", "completed", 6))

    df = analysis.load(tmp_path)
    assert len(df) == 12
    a, b = df[df.estimator == "ppo_gae"], df[df.estimator == "rloo"]
    assert b["entropy"].isna().all() and a["entropy"].notna().all()
    assert b["value_loss"].isna().all() and a["value_loss"].notna().all()
    assert a["legacy_metric"].isna().all() and b["legacy_metric"].tolist() == list(range(6))
    assert df["env_steps"].tolist()[:6] == list(new["env_steps"])
    # every contract column exists even if no run logged it
    for col in ("kl_ref", "gold_reward", "group_size", "tokens"):
        assert col in df.columns and df[col].isna().all()
    assert set(df["run_dir"]) == {f"{TASK}/ppo_gae/s0", f"{TASK}/rloo/s1"}
    assert (df["status"] == "completed").all()


def test_diverged_run_is_kept_and_marked(tmp_path):
    write_run(tmp_path / TASK / "ppo_gae" / "ok", _cols("ppo_gae", 0),
              summary=_summary("ok", "completed", 6))
    write_run(tmp_path / TASK / "ppo_gae" / "bad", _cols("ppo_gae", 1, iterations=10, diverge_at=4),
              summary=_summary("bad", "diverged", 4))
    df = analysis.load(tmp_path)
    bad = df[df.run_dir == f"{TASK}/ppo_gae/bad"]
    assert len(bad) == 4
    assert (bad["status"] == "diverged").all()
    assert (bad["reason"] == "non-finite loss").all()
    assert np.isinf(bad["approx_kl"]).any()        # the evidence of divergence survives


def test_worst_return_comes_from_the_runs_config_yaml(tmp_path):
    """task.worst_return of a run's config.yaml is its rows' worst_return; a run written
    before the field existed (or with null, or no config.yaml) has NaN."""
    configs = {"new": "task:\n  name: CartPole-v1\n  worst_return: -12.5\n",
               "old": "task:\n  name: CartPole-v1\n", "null": "task:\n  worst_return: null\n",
               "none": None}
    for name, config in configs.items():
        write_run(tmp_path / TASK / "ppo_gae" / name, _cols("ppo_gae", 0),
                  summary=_summary(name, "completed", 6), config=config)
    df = analysis.load(tmp_path)
    worst = df.groupby("run_dir")["worst_return"].agg(lambda v: v.tolist())
    assert worst[f"{TASK}/ppo_gae/new"] == [-12.5] * 6
    for name in ("old", "null", "none"):
        assert np.isnan(worst[f"{TASK}/ppo_gae/{name}"]).all(), name
    (tmp_path / "empty").mkdir()
    assert "worst_return" in analysis.load(tmp_path / "empty").columns


def test_corrupt_parquet_is_named_and_left_out(tmp_path):
    write_run(tmp_path / TASK / "a2c" / "good", _cols("a2c", 0), summary=_summary("g", "completed", 6))
    bad = write_run(tmp_path / TASK / "a2c" / "bad", _cols("a2c", 1),
                    summary=_summary("b", "completed", 6)) / "metrics.parquet"
    bad.write_bytes(bad.read_bytes()[: len(bad.read_bytes()) // 2])       # half-copied file
    junk = tmp_path / TASK / "a2c" / "junk"
    junk.mkdir()
    (junk / "metrics.parquet").write_bytes(b"not a parquet file at all")
    with warnings.catch_warnings():
        warnings.simplefilter("error", AnalysisWarning)    # named in left_out, not as a warning
        df = analysis.load(tmp_path)
    left = {r["run_dir"]: r["reason"] for r in df.attrs["left_out"]}
    assert set(left) == {f"{TASK}/a2c/bad", f"{TASK}/a2c/junk"}
    assert left[f"{TASK}/a2c/bad"].startswith("unreadable metrics.parquet (")
    assert left[f"{TASK}/a2c/junk"] == "no summary.json (not run, still running or killed)"
    assert set(df["run_dir"]) == {f"{TASK}/a2c/good"}
    assert len(df) == 6
    assert df.attrs["skipped"] == [bad.as_posix()]
    paths = {r["run_dir"]: r["path"] for r in df.attrs["left_out"]}
    assert paths[f"{TASK}/a2c/bad"] == bad.parent.as_posix()


def test_incomplete_and_unreadable_summary(tmp_path):
    write_run(tmp_path / TASK / "rloo" / "running", _cols("rloo", 0))          # no summary.json
    d = write_run(tmp_path / TASK / "rloo" / "torn", _cols("rloo", 1))
    (d / "summary.json").write_text('{"run_id": "x", "stat')                # torn JSON
    assert analysis.load(tmp_path).empty                                    # neither is finished
    df = analysis.load(tmp_path, finished_only=False)                       # as they stand
    status = df.groupby("run_dir")["status"].first()
    assert status[f"{TASK}/rloo/running"] == "incomplete"
    assert status[f"{TASK}/rloo/torn"] == "unknown"
    left = {r["run_dir"]: r["reason"] for r in analysis.load(tmp_path).attrs["left_out"]}
    assert left[f"{TASK}/rloo/torn"].startswith("unreadable summary.json (JSONDecodeError: ")


def test_identity_filled_from_config_then_layout(tmp_path):
    cols = {k: v for k, v in _cols("grpo", 0).items() if k not in ("task", "estimator", "seed", "run_id")}
    write_run(tmp_path / "Acrobot-v1" / "grpo" / "r0", cols,
              config="seed: 7\ntask:\n  name: Acrobot-v1\nestimator:\n  name: grpo\n")
    write_run(tmp_path / "Pendulum-v1" / "remax" / "r1", cols)            # no config at all
    with warnings.catch_warnings():
        warnings.simplefilter("error", AnalysisWarning)                   # nothing is unreadable
        df = analysis.load(tmp_path, finished_only=False)                 # no summary.json
    first = df.groupby("run_dir").first()
    assert first.loc["Acrobot-v1/grpo/r0", ["task", "estimator", "seed"]].tolist() == ["Acrobot-v1", "grpo", 7.0]
    assert first.loc["Pendulum-v1/remax/r1", ["task", "estimator"]].tolist() == ["Pendulum-v1", "remax"]
    assert first.loc["Pendulum-v1/remax/r1", "run_id"] == "Pendulum-v1/remax/r1"


def test_stacked_seeds_in_one_directory_are_left_out(tmp_path):
    """The harness writes one directory per population member; a directory stacking two seeds
    has iterations 1..6 twice, which is not a finished run by the shared definition."""
    a, b = _cols("ppo_gae", 0), _cols("ppo_gae", 1)
    both = {k: list(a[k]) + list(b[k]) for k in a}
    write_run(tmp_path / TASK / "ppo_gae" / "pop", both, summary=_summary("p", "completed", 6))
    df = analysis.load(tmp_path)
    assert df.empty
    assert df.attrs["left_out"][0]["reason"] == "metrics.parquet holds iterations [1..6] (12 rows), summary.json says 6"
    runs = analysis.run_table(analysis.load(tmp_path, finished_only=False))   # as they stand
    assert len(runs) == 2 and sorted(runs["seed"]) == [0.0, 1.0]


def test_missing_and_empty_folders(tmp_path):
    with pytest.raises(FileNotFoundError):
        analysis.load(tmp_path / "nope")
    df = analysis.load(tmp_path)
    assert df.empty and "eval_return" in df.columns and "run_dir" in df.columns


def test_run_without_metrics_is_listed(tmp_path):
    d = tmp_path / TASK / "ppo_gae" / "crashed"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(_summary("c", "failed", 0)))
    write_run(tmp_path / TASK / "ppo_gae" / "ok", _cols("ppo_gae", 0), summary=_summary("o", "completed", 6))
    df = analysis.load(tmp_path)
    runs = df.attrs["runs"].set_index("run_dir")
    assert runs.loc[f"{TASK}/ppo_gae/crashed", "status"] == "failed"
    assert not runs.loc[f"{TASK}/ppo_gae/crashed", "has_metrics"]
    assert set(df["run_dir"]) == {f"{TASK}/ppo_gae/ok"}


def test_old_files_without_update_or_loss_agg_load_with_nulls_or_their_config(tmp_path):
    write_run(tmp_path / TASK / "rloo" / "old", _cols("rloo", 0, critic=False),
              summary=_summary("o", "completed", 6))                          # no config: nulls
    write_run(tmp_path / TASK / "rloo" / "cfg", _cols("rloo", 1, critic=False),
              summary=_summary("c", "completed", 6), config="update: pg\nloss_agg: token_mean\n")
    df = analysis.load(tmp_path)
    by = df.groupby("run_dir")
    assert by["update"].first().to_dict() == {f"{TASK}/rloo/cfg": "pg", f"{TASK}/rloo/old": None}
    assert df.loc[df.run_dir.str.endswith("old"), ["update", "loss_agg"]].isna().all().all()
    assert (df.loc[df.run_dir.str.endswith("cfg"), "loss_agg"] == "token_mean").all()
    # a setting only one run recorded still splits the name: the other run's is unknown
    assert set(df["estimator"]) == {"rloo[update=null, loss_agg=null]", "rloo[update=pg, loss_agg=token_mean]"}
    assert (df["estimator_name"] == "rloo").all()


def test_runs_differing_in_update_or_loss_agg_get_separate_labels(tmp_path):
    def run(est, seed, update, agg):
        cols = _cols(est, seed)
        cols["update"], cols["loss_agg"] = [update] * 6, [agg] * 6
        write_run(tmp_path / TASK / est / f"s{seed}", cols, summary=_summary(f"{est}{seed}", "completed", 6))

    run("ppo_gae", 0, "clip", "token_mean")
    run("ppo_gae", 1, "pg", "token_mean")
    run("grpo", 2, "clip", "token_mean")
    run("grpo", 3, "clip", "seq_mean_token_sum_norm")
    run("a2c", 4, "pg", "token_mean")
    run("a2c", 5, "pg", "token_mean")
    df = analysis.load(tmp_path)
    labels = df.drop_duplicates("run_dir").set_index("run_dir")["estimator"].to_dict()
    assert labels == {
        f"{TASK}/ppo_gae/s0": "ppo_gae[update=clip]", f"{TASK}/ppo_gae/s1": "ppo_gae[update=pg]",
        f"{TASK}/grpo/s2": "grpo[loss_agg=token_mean]",
        f"{TASK}/grpo/s3": "grpo[loss_agg=seq_mean_token_sum_norm]",
        f"{TASK}/a2c/s4": "a2c", f"{TASK}/a2c/s5": "a2c",                 # one setting: plain name
    }
    assert sorted(df["estimator_name"].unique()) == ["a2c", "grpo", "ppo_gae"]
    from analysis.load import label_variants
    assert label_variants(df)["estimator"].tolist() == df["estimator"].tolist()  # idempotent
    # a frame with the registered names only gets its labels in a new frame; the caller's is untouched
    plain = df.assign(estimator=df["estimator_name"]).drop(columns="estimator_name")
    before = plain.copy()
    labelled = label_variants(plain)
    assert labelled["estimator"].tolist() == df["estimator"].tolist()
    assert labelled["estimator_name"].tolist() == df["estimator_name"].tolist()
    assert plain.equals(before) and "estimator_name" not in plain


# ---------------------------------------------------------------- reading each file once (issue 16)
def _folder_of_clean_runs(root, n=3):
    for s in range(n):
        write_run(root / TASK / "ppo_gae" / f"s{s}", _cols("ppo_gae", s),
                  summary={**_summary(f"r{s}", "completed", 6),
                           "config": {"task": {"name": TASK, "worst_return": -7.0}, "estimator": "ppo_gae",
                                      "seed": s, "budget": {"iterations": 6}}},
                  config="task: {name: [")  # a torn config.yaml: summary.json's config is read instead


def test_summary_config_stands_in_for_config_yaml_and_each_file_is_read_once(tmp_path, monkeypatch):
    """A run whose summary.json records its config (the harness writes it since issue 16) is
    loaded without config.yaml (torn here, so a YAML read would leave it out), and each metrics
    file of a folder of clean runs is read once."""
    import collections
    import importlib

    load_mod = importlib.import_module("analysis.load")
    _folder_of_clean_runs(tmp_path)
    reads = collections.Counter()
    read_parquet = load_mod.read_parquet

    def counted(path, columns=None):
        reads[Path(path).relative_to(tmp_path).as_posix()] += 1
        return read_parquet(path, columns)

    monkeypatch.setattr(load_mod, "read_parquet", counted)
    df = analysis.load(tmp_path)
    assert dict(reads) == {f"{TASK}/ppo_gae/s{s}/metrics.parquet": 1 for s in range(3)}
    assert df.attrs["left_out"] == []
    assert len(df) == 18 and sorted(df["run_dir"].unique()) == [f"{TASK}/ppo_gae/s{s}" for s in range(3)]
    assert (df["worst_return"] == -7.0).all()                    # from summary.json's config
    # each run's rows are its own file's, in order: iterations 1..6, its seed's curve
    for s in range(3):
        rows = df[df.run_dir == f"{TASK}/ppo_gae/s{s}"]
        assert rows["iteration"].tolist() == list(range(1, 7))
        np.testing.assert_array_equal(rows["episode_return"].to_numpy(), _cols("ppo_gae", s)["episode_return"])


def test_summary_config_budget_is_checked(tmp_path):
    _folder_of_clean_runs(tmp_path, n=2)
    p = tmp_path / TASK / "ppo_gae" / "s1" / "summary.json"
    summary = json.loads(p.read_text())
    summary["config"]["budget"]["iterations"] = 5                # 6 iterations logged: over budget
    p.write_text(json.dumps(summary))
    df = analysis.load(tmp_path)
    assert set(df["run_dir"]) == {f"{TASK}/ppo_gae/s0"}
    (out,) = df.attrs["left_out"]
    assert out["reason"] == "summary.json says 6 iterations, over budget.iterations=5 in summary.json's config"


@pytest.mark.parametrize("fault", ["rows_off", "skips_one", "restarts", "torn_file"])
def test_one_bad_file_among_clean_ones_is_named_and_the_rest_load(tmp_path, fault):
    """The one at fault is named: a file whose iterations do not match its summary (it reads
    fine, and the iterations of all files are checked at once: as many rows as the summary says
    but one skipped, or counted again from 1), or one that does not read."""
    _folder_of_clean_runs(tmp_path, n=4)
    bad = tmp_path / TASK / "ppo_gae" / "s2" / "metrics.parquet"
    if fault == "rows_off":
        write_run(bad.parent, _cols("ppo_gae", 2, iterations=5))  # summary still says 6
        why = "metrics.parquet holds iterations [1..5] (5 rows), summary.json says 6"
    elif fault in ("skips_one", "restarts"):
        cols = _cols("ppo_gae", 2)
        cols["iteration"] = np.array([1, 2, 3, 4, 5, 7] if fault == "skips_one" else [1, 2, 3, 1, 2, 3])
        write_run(bad.parent, cols)
        why = f"metrics.parquet holds iterations [1..{7 if fault == 'skips_one' else 3}] (6 rows), summary.json says 6"
    else:
        bad.write_bytes(bad.read_bytes()[:-40])
        why = "unreadable metrics.parquet ("
    df = analysis.load(tmp_path)
    assert sorted(df["run_dir"].unique()) == [f"{TASK}/ppo_gae/s{s}" for s in (0, 1, 3)]
    (out,) = df.attrs["left_out"]
    assert out["run_dir"] == f"{TASK}/ppo_gae/s2" and out["reason"].startswith(why)
    assert len(df) == 18


def test_iterations_written_as_floats_count_as_1_to_n(tmp_path):
    """Rule 3 compares values, as the harness's check does (``[1.0, 2.0] == [1, 2]``): a run
    whose iteration column is float is finished when its values are 1..n, in a folder where the
    other runs' column is int (stacked as float)."""
    _folder_of_clean_runs(tmp_path, n=3)
    cols = _cols("ppo_gae", 1)
    cols["iteration"] = np.arange(1.0, 7.0)
    write_run(tmp_path / TASK / "ppo_gae" / "s1", cols)
    df = analysis.load(tmp_path)
    assert df.attrs["left_out"] == [] and len(df) == 18
    cols["iteration"] = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.5])
    write_run(tmp_path / TASK / "ppo_gae" / "s1", cols)
    (out,) = analysis.load(tmp_path).attrs["left_out"]
    assert out["run_dir"] == f"{TASK}/ppo_gae/s1"
    assert out["reason"] == "metrics.parquet holds iterations [1.0..6.5] (6 rows), summary.json says 6"


def test_a_column_string_in_one_run_and_number_in_another_is_read_as_strings(tmp_path):
    a, b = _cols("ppo_gae", 0), _cols("rloo", 1)
    a["note"], b["note"] = np.arange(6.0), np.array(["x"] * 6)
    write_run(tmp_path / TASK / "ppo_gae" / "s0", a, summary=_summary("a", "completed", 6))
    write_run(tmp_path / TASK / "rloo" / "s1", b, summary=_summary("b", "completed", 6))
    with pytest.warns(AnalysisWarning, match="column\\(s\\) note read as strings"):
        df = analysis.load(tmp_path)
    assert df.loc[df.estimator == "ppo_gae", "note"].tolist() == ["0", "1", "2", "3", "4", "5"]
    assert df.loc[df.estimator == "rloo", "note"].tolist() == ["x"] * 6


def test_the_harness_writes_the_config_analysis_reads_into_summary_json(tmp_path):
    """summary.json's ``config`` is config.yaml's values, so a folder loads the same either way."""
    import shutil
    import subprocess
    import sys

    import yaml

    subprocess.run([sys.executable, "-m", "harness", "task=cartpole", "estimator=rloo", "seed=3",
                    "budget.iterations=2", "progress=false", "eval_every=0", f"results_dir={tmp_path / 'r'}"],
                   check=True, capture_output=True)
    (run,) = (tmp_path / "r").glob("*/*/*/summary.json")
    cfg = yaml.safe_load((run.parent / "config.yaml").read_text())
    got = json.loads(run.read_text())["config"]
    assert got == {"task": {"name": "cartpole", "env_id": "CartPole-v1", "worst_return": cfg["task"]["worst_return"]},
                   "estimator": "rloo", "seed": 3, "update": cfg["update"], "loss_agg": cfg["loss_agg"],
                   "budget": {"iterations": 2}}
    with_summary = analysis.load(tmp_path / "r")
    legacy = tmp_path / "legacy"
    shutil.copytree(tmp_path / "r", legacy)
    (p,) = legacy.glob("*/*/*/summary.json")
    p.write_text(json.dumps({k: v for k, v in json.loads(p.read_text()).items() if k != "config"}))
    import pandas as pd
    pd.testing.assert_frame_equal(with_summary, analysis.load(legacy))


def test_run_folders_are_found_in_path_order_hidden_skipped_links_named(tmp_path):
    """The walk: run folders sorted part by part (``a/b`` before ``a-b/c``, though ``"a-b" <
    "a/"`` as strings), the root itself when it is a run, hidden folders skipped, a symlinked
    folder named and not entered, a folder with only other files not a run."""
    for rel in ("a/b", "a-b/c", ".hidden/r", "z"):
        (tmp_path / rel).mkdir(parents=True)
        (tmp_path / rel / "summary.json").write_text("{}")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("x")
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "y").symlink_to(tmp_path / "a", target_is_directory=True)
    assert analysis.find_run_dirs(tmp_path) == [tmp_path, tmp_path / "a" / "b", tmp_path / "a-b" / "c", tmp_path / "z"]
    from analysis.load import left_out_links
    assert [r["run_dir"] for r in left_out_links(tmp_path)] == ["y"]


# ---------------------------------------------------------------- row order (issue 16)
def _written(tmp_path, layout):
    """Write ``layout``: (run dir, task, estimator, seed, update), the k-th run with 4 + k
    iterations (blocks of different sizes); returns each dir's episode_return."""
    out = {}
    for k, (rel, task, est, seed, update) in enumerate(layout):
        n = 4 + k
        cols = curve_columns("CartPole-v1", est, seed, iterations=n, eval_every=2)
        cols["task"], cols["update"] = [task] * n, [update] * n
        write_run(tmp_path / rel, cols, summary=_summary(rel, "completed", n))
        out[rel] = list(cols["episode_return"])
    return out


@pytest.mark.parametrize("finished_only,stacked,renumber", [(True, None, False), (False, (7, 6), False),
                                                             (False, (7, 7), False), (False, (7, 6), True)])
def test_rows_are_in_pandas_sort_order_when_the_walk_order_is_not(tmp_path, finished_only, stacked, renumber):
    """The walk sorts run directories as paths; the frame is sorted by task, estimator (its label),
    run_dir, seed, iteration. Here the directories' names disagree with the tasks their runs
    logged and with the labels, so the runs must move: the frame equals pandas' own sort of it,
    and every run's rows are the rows it wrote, whole and in iteration order. With
    ``finished_only=False`` a directory stacking two runs is loaded too (seeds 7 and 6: seed not
    constant in its rows; 7 and 7: its iterations repeated; 7 and 6 numbered 1..12: only the seed
    changes), which only pandas' sort of the rows can order."""
    from analysis.load import SORT_COLUMNS
    written = _written(tmp_path, [
        ("a/ppo_gae/r0", "Zeta", "ppo_gae", 3, "clip"), ("a/ppo_gae/r1", "Alpha", "ppo_gae", 1, "pg"),
        ("b/grpo/r2", "Alpha", "grpo", 2, "clip"), ("b/grpo/r3", "Zeta", "grpo", 0, "clip"),
        ("c/a2c/r4", "Alpha", "a2c", 5, "clip"), ("c/a2c/r5", "Alpha", "a2c", 4, "clip")])
    if not finished_only:
        a, b = _cols("ppo_gae", stacked[0]), _cols("ppo_gae", stacked[1])
        if renumber:
            b["iteration"] = np.asarray(b["iteration"]) + len(a["iteration"])
        write_run(tmp_path / "a" / "ppo_gae" / "stack", {k: list(a[k]) + list(b[k]) for k in a})
    df = analysis.load(tmp_path, finished_only=finished_only)
    expect = df.sort_values(SORT_COLUMNS, kind="stable", na_position="last").reset_index(drop=True)
    assert df.equals(expect) and list(df.index) == list(range(len(df)))
    order = df.drop_duplicates("run_dir")["run_dir"].tolist()  # Alpha: a2c, grpo, ppo_gae[update=pg]; Zeta
    assert order[:6] == ["c/a2c/r4", "c/a2c/r5", "b/grpo/r2", "a/ppo_gae/r1", "b/grpo/r3", "a/ppo_gae/r0"] \
        if finished_only else order[:2] == ["c/a2c/r4", "c/a2c/r5"]
    for rel, ret in written.items():
        rows = df[df["run_dir"] == rel]
        assert rows["iteration"].tolist() == list(range(1, len(ret) + 1))
        np.testing.assert_array_equal(rows["episode_return"].to_numpy(), ret)


@pytest.mark.parametrize("runs", [1, 3])
def test_every_column_of_the_frame_takes_an_in_place_write_to_itself_alone(tmp_path, runs):
    """A loaded frame is the user's to edit: ``df.loc[row, col] = v`` works on every column
    (none is a read-only view of Arrow memory, as a column Arrow hands over without copying
    would be: one run's file read as one chunk, or a number column cast in Arrow), and the write
    changes that cell only, in no other column. Extra columns of each kind a run may log ride
    along."""
    for s in range(runs):
        cols = _cols("ppo_gae", s)
        cols.update(extra_int=np.arange(6, dtype=np.int64), extra_float=np.linspace(0, 1, 6),
                    extra_bool=np.arange(6) % 2 == 0, extra_str=[f"x{i}" for i in range(6)])
        write_run(tmp_path / TASK / "ppo_gae" / f"s{s}", cols, summary=_summary(f"r{s}", "completed", 6))
    df = analysis.load(tmp_path)
    assert len(df) == 6 * runs
    row = df.index[len(df) // 2]
    for c in df.columns:
        before = df.copy()
        kind = df[c].dtype.kind
        value = (not df.at[row, c]) if kind == "b" else 7 if kind in "iuf" else "edited"
        df.loc[row, c] = value
        assert df.at[row, c] == value, c
        changed = [o for o in df.columns if o != c and not df[o].equals(before[o])]
        assert not changed and df.drop(index=row).equals(before.drop(index=row)), (c, changed)


@pytest.mark.parametrize("block", [1, 2, 3, 4, 7, 100])
def test_the_tables_conversion_equals_arrows_own_at_any_block_size(block, monkeypatch):
    """load converts the stacked table to pandas a block of rows at a time (so it can free the
    table as it goes): at any block size, with columns chunked alike and unalike, the frame
    equals Arrow's own ``to_pandas`` of the table, dtypes included (ints with nulls as float
    NaN, float32 kept, a non-contract int kept int), with the columns asked for as float made
    float64."""
    import pandas as pd
    import pyarrow as pa

    import importlib

    L = importlib.import_module("analysis.load")
    monkeypatch.setattr(L, "_BLOCK_ROWS", block)

    def chunked(values, sizes, typ):
        out, i = [], 0
        for n in sizes:
            out.append(pa.array(values[i:i + n], typ))
            i += n
        return pa.chunked_array(out, typ)

    sizes = [3, 0, 5, 2, 1]  # one run's file each (one is empty); 11 rows
    table = pa.table({
        "f64": chunked([0.5 * i for i in range(11)], sizes, pa.float64()),
        "i64": chunked(list(range(11)), sizes, pa.int64()),
        "i64_nulls": chunked([None if i % 4 == 1 else i for i in range(11)], sizes, pa.int64()),
        "f32_nulls": chunked([None if i == 6 else i / 8 for i in range(11)], sizes, pa.float32()),
        "i32_as_float": chunked([2 ** 20 + i for i in range(11)], sizes, pa.int32()),
        "one_chunk": chunked([-1.0 * i for i in range(11)], [11], pa.float64()),  # filled by load
        "other_cuts": chunked(list(range(100, 111)), [4, 4, 3], pa.int16()),
        "empty": chunked([None] * 11, sizes, pa.float64()),
        "flag": chunked([i % 3 == 0 for i in range(11)], sizes, pa.bool_()),
        "name": chunked([f"r{i // 3}" for i in range(11)], sizes, pa.string()),
    })
    expected = table.to_pandas()
    expected["i32_as_float"] = expected["i32_as_float"].astype(np.float64)
    held = [table]
    del table
    df = L._to_pandas(held, {"i32_as_float"})
    assert held == []
    pd.testing.assert_frame_equal(df, expected)
    assert df["i64"].dtype == np.int64 and df["f32_nulls"].dtype == np.float32  # the oracle's own dtypes
    assert np.isnan(df.at[1, "i64_nulls"]) and df.at[4, "i64_nulls"] == 4.0


def test_load_frees_the_runs_metrics_as_it_fills_the_frame(tmp_path, monkeypatch):
    """The stacked metrics are freed run by run as the frame is filled, not held until it is
    whole (the frame then reuses their memory: issue 16). Arrow's allocation is looked at each
    time a block of rows is converted: by the last block, most of the runs' memory is freed."""
    import importlib
    import sys

    import pyarrow as pa

    L = importlib.import_module("analysis.load")  # the module (``analysis.load`` is also the function)
    for s in range(24):
        cols = _cols("ppo_gae", s, iterations=200)
        cols.update({f"x{k}": np.random.default_rng(k).normal(size=200) for k in range(8)})
        write_run(tmp_path / TASK / "ppo_gae" / f"s{s:02d}", cols, summary=_summary(f"r{s}", "completed", 200))
    seen = []
    chunked_array = pa.chunked_array

    def spy(*args, **kwargs):
        if sys._getframe(1).f_globals["__name__"] == "analysis.load":  # a block of the frame's rows
            seen.append(pa.total_allocated_bytes())
        return chunked_array(*args, **kwargs)

    monkeypatch.setattr(L, "_BLOCK_ROWS", 400)  # two runs a block
    monkeypatch.setattr(pa, "chunked_array", spy)
    df = analysis.load(tmp_path)
    assert len(df) == 24 * 200
    assert len(seen) > 12 and seen[-1] < 0.25 * seen[0], seen


def test_runs_whose_iterations_are_not_1_to_n_are_the_ones_left_out(tmp_path, monkeypatch):
    """Rule 3, checked on all the runs' stacked rows at once: of runs with the right row count,
    exactly those whose iteration column is not 1..n are left out, wherever the fault sits (a
    run's first row, its last, inside it, a run next to one without rows), and only they are
    checked again one by one (no run is blamed for the step into its first row: at 10,000 runs
    each would be read back as a Python list)."""
    import importlib

    L = importlib.import_module("analysis.load")
    checked = []
    check_iterations = L.check_iterations

    def spy(parts, its):
        checked.append(its)
        return check_iterations(parts, its)

    monkeypatch.setattr(L, "check_iterations", spy)
    n = 5
    bad = {"a_first": [0, 2, 3, 4, 5], "b_inside": [1, 2, 2, 4, 5], "c_last": [1, 2, 3, 4, 6],
           "d_shift": [2, 3, 4, 5, 6], "f_float": [1.0, 2.0, 3.5, 4.0, 5.0]}
    good = {"a_ok": list(range(1, n + 1)), "c_ok": list(range(1, n + 1)), "e_ok": list(range(1, n + 1)),
            "g_ok": [1.0, 2.0, 3.0, 4.0, 5.0]}
    for name, its in {**bad, **good}.items():
        cols = _cols("ppo_gae", 0, iterations=n)
        cols["iteration"] = its
        write_run(tmp_path / TASK / "ppo_gae" / name, cols, summary=_summary(name, "completed", n))
    write_run(tmp_path / TASK / "ppo_gae" / "e_empty", {k: v[:0] for k, v in _cols("ppo_gae", 0).items()},
              summary=_summary("e_empty", "completed", 0))
    df = analysis.load(tmp_path)
    left = {Path(r["run_dir"]).name for r in df.attrs["left_out"]}
    # e_empty: finished with no rows, stacked as a run of 0 rows, and left out as it has no score (issue 36)
    assert left == set(bad) | {"e_empty"}, left
    assert [r["reason"] for r in df.attrs["left_out"] if r["run_dir"].endswith("e_empty")] == [L.NO_SCORE]
    assert len(checked) == len(bad)
    assert set(df["run_dir"].map(lambda d: Path(d).name)) == set(good)
    assert df.groupby("run_dir")["iteration"].apply(list).map(lambda v: v == [1.0, 2.0, 3.0, 4.0, 5.0]).all()
