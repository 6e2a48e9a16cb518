"""``logger=wandb`` and ``logger=mlflow`` (harness.io.trackers): every run's metric rows also in the tracker.

Each tracker's own store is read back and compared with metrics.parquet read independently with
pandas (tests/tracker_helpers.py): one value per numeric non-null cell, named after its column,
at step ``env_steps``, as a 64-bit float (both trackers keep doubles: compared exactly).

* wandb (offline, no network): the run's ``<run dir>/wandb/offline-run-*/run-<id>.wandb``, the
  transaction log ``wandb sync`` uploads. wandb 0.31 ships no Python reader of it (its
  ``sdk.internal.datastore`` is gone; wandb-core reads it), so :func:`wandb_records` walks the
  file's framing (LevelDB's log format: 32 KiB blocks, 7-byte record headers) and parses each
  record with wandb's own protobuf class ``wandb_internal_pb2.Record``.
* MLflow: ``mlflow.tracking.MlflowClient`` on the SQLite store ``<results_dir>/mlflow.db``.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.app import run
from harness.config import LOGGERS
from harness.io.trackers import TRACKERS
from tests.control_helpers import TINY, make_cfg
from tests.test_checkpoint import Killed, kill_at
from tests.tracker_helpers import expected_from_parquet, run_dirs

CONTROL = ["task=cartpole", "estimator=a2c", *TINY, "budget.iterations=3", "eval_every=2", "threads=1"]
REPO = Path(__file__).resolve().parents[1]
BACKENDS = ["wandb", "mlflow"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path_factory):
    """No network and no user settings: wandb offline (the harness's default), MLflow's store the
    default one; wandb's own cache, config and data folders (its service's debug logs) not in $HOME."""
    for var in ("WANDB_MODE", "WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    home = tmp_path_factory.mktemp("wandb-home")
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(home / var.lower()))


# ------------------------------------------------------------------ reading the trackers back
def wandb_records(path: Path):
    """The protobuf records of a ``.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    pos, buf, block = 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk  # FULL, FIRST | MIDDLE, LAST
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            yield record


def wandb_runs(root: Path) -> list[dict]:
    """Every offline wandb run under ``root``: id, name, group, config, history, exit code."""
    out = []
    for f in sorted(root.rglob("wandb/offline-run-*/run-*.wandb")):
        r = {"file": f, "history": {}, "exit_code": None}
        for rec in wandb_records(f):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                r.update(id=rec.run.run_id, name=rec.run.display_name, group=rec.run.run_group,
                         config={i.key: json.loads(i.value_json) for i in rec.run.config.update if i.key != "_wandb"})
            elif kind == "history":
                for i in rec.history.item:  # a plain name arrives as key or as a one-part nested_key
                    k = i.key or ".".join(i.nested_key)
                    if not k.startswith("_"):  # _step, _runtime, _timestamp: wandb's own
                        r["history"].setdefault(k, []).append((rec.history.step.num, float(json.loads(i.value_json))))
            elif kind == "exit":
                r["exit_code"] = rec.exit.exit_code
        r["run_dir"] = f.parents[2]
        out.append(r)
    return out


def mlflow_runs(root: Path) -> list[dict]:
    """Every MLflow run of ``root``'s experiment in ``root/mlflow.db``: id, name, group, params, history, status."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root.resolve()}/mlflow.db")
    exp = client.get_experiment_by_name(str(root.resolve()))
    out = []
    for run_ in client.search_runs([exp.experiment_id]):
        rid = run_.info.run_id
        history = {k: [(m.step, m.value) for m in sorted(client.get_metric_history(rid, k), key=lambda m: m.step)]
                   for k in run_.data.metrics}
        out.append({"id": rid, "name": run_.info.run_name, "group": run_.data.tags["group"],
                    "harness_run": run_.data.tags["harness.run_id"], "params": run_.data.params,
                    "history": history, "status": run_.info.status})
    return out


def wandb_runs_settled(root: Path, timeout: float = 60.0) -> list[dict]:
    """:func:`wandb_runs` once every run file holds its exit record (or after ``timeout`` s).
    wandb's service process writes the ``.wandb`` file; once, in CI on a loaded machine, the file
    read straight after ``finish()`` held the run record without its history (not reproduced in
    20 runs here), as if the service had not written it yet: it is read again until complete."""
    deadline = time.monotonic() + timeout
    while True:
        runs = wandb_runs(root)
        if all(r["exit_code"] is not None for r in runs) or time.monotonic() > deadline:
            return runs
        time.sleep(0.2)


def tracker_runs(backend: str, root: Path) -> list[dict]:
    pytest.importorskip(backend)
    return wandb_runs_settled(root) if backend == "wandb" else mlflow_runs(root)


def leaves(d: dict, prefix: str = "") -> dict[str, object]:
    """``{"task.name": "cartpole", ...}`` of a nested dict (an empty dict has no leaves)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_run(backend: str, tr: dict, run_dir: Path, root: Path, want: dict | None = None) -> None:
    """``tr`` (one tracker run) holds ``run_dir``'s metrics.parquet (or the history ``want``), its
    config.yaml, its name and group."""
    assert tr["history"] == (expected_from_parquet(run_dir) if want is None else want)
    config = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"))
    name = str(run_dir.relative_to(root))  # cartpole/a2c/seed0-<hash>
    seed, config_hash = run_dir.name.split("-")
    assert tr["name"] == name
    assert tr["group"] == f"{run_dir.parent.relative_to(root)}/{config_hash}"
    if backend == "wandb":
        assert tr["config"] == config
        assert tr["run_dir"] == run_dir
    else:
        assert tr["params"] == {k: str(v) for k, v in leaves(config).items()}
        assert tr["harness_run"] == name


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize("backend", BACKENDS)
def test_tracker_run_holds_metrics_parquet_config_and_group(backend, tmp_path):
    pytest.importorskip(backend)
    run(make_cfg([*CONTROL, f"results_dir={tmp_path}", f"logger={backend}"]))
    (d,) = run_dirs(tmp_path)
    (tr,) = tracker_runs(backend, tmp_path)
    check_run(backend, tr, d, tmp_path)
    assert [v for _, v in tr["history"]["iteration"]] == [1.0, 2.0, 3.0]
    assert len(tr["history"]["eval_return"]) == 2  # evaluated at iteration 2 and at the end
    assert {"run_id", "task", "update"}.isdisjoint(tr["history"])  # strings are not values
    assert (tr["exit_code"] == 0) if backend == "wandb" else (tr["status"] == "FINISHED")
    if backend == "mlflow":
        assert {p.name for p in tmp_path.iterdir()} == {"cartpole", "mlflow.db"}  # no ./mlruns anywhere
        assert not (REPO / "mlruns").exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_population_member_each_its_own_tracker_run_shadows_none(backend, tmp_path):
    pytest.importorskip(backend)
    # seed 6 finished alone first: in the population below it is a shadow member (trained, writes nothing)
    run(make_cfg([*CONTROL, f"results_dir={tmp_path}", "seed=6"]))
    run(make_cfg([*CONTROL, f"results_dir={tmp_path}", f"logger={backend}", "population=3", "seed=4"]))
    dirs = run_dirs(tmp_path)
    assert [d.name.split("-")[0] for d in dirs] == ["seed4", "seed5", "seed6"]
    trs = sorted(tracker_runs(backend, tmp_path), key=lambda t: t["name"])
    assert len(trs) == 2  # seed4, seed5; the shadow seed6 none
    for tr, d in zip(trs, dirs[:2]):
        check_run(backend, tr, d, tmp_path)
        assert {v for _, v in tr["history"]["seed"]} == {float(d.name[4])}
    assert trs[0]["group"] == trs[1]["group"] and trs[0]["id"] != trs[1]["id"]


@pytest.mark.parametrize("backend,killed_at", [("wandb", 6), ("mlflow", 6), ("mlflow", 4)])
def test_resumed_run_ends_with_one_tracker_run_each_step_once(backend, killed_at, tmp_path, monkeypatch):
    """Killed at 6 (checkpoint at 3; 4 and 5 logged, then redone with another wall_time_s) or at 4
    (nothing logged past the checkpoint): the same tracker run continues, never doubled. Offline
    wandb writes the run's offline folder again (one to sync, the same id); MLflow keeps the
    killed attempt's wall_time_s at the steps it held (it deletes no metric value)."""
    pytest.importorskip(backend)
    args = [*CONTROL, "budget.iterations=7", "checkpoint_every=3", f"results_dir={tmp_path}", f"logger={backend}"]
    kill_at(monkeypatch, killed_at)  # dies building that iteration's row: the rows before it logged
    with pytest.raises(Killed):
        run(make_cfg(args))
    monkeypatch.undo()
    (killed,) = tracker_runs(backend, tmp_path)
    assert [v for _, v in killed["history"]["iteration"]] == [float(i) for i in range(1, killed_at)]  # live
    assert (killed["exit_code"] == 1) if backend == "wandb" else (killed["status"] == "KILLED")
    assert run(make_cfg(args)) == {"skipped": 0, "completed": 1}
    (d,) = run_dirs(tmp_path)
    (tr,) = tracker_runs(backend, tmp_path)
    assert tr["id"] == killed["id"]  # the same tracker run
    assert [v for _, v in tr["history"]["iteration"]] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]  # each once
    assert (tr["exit_code"] == 0) if backend == "wandb" else (tr["status"] == "FINISHED")
    if backend == "wandb":  # one offline run to sync, written again from the checkpoint's rows
        assert len(list((d / "wandb").glob("offline-run-*"))) == 1
        check_run(backend, tr, d, tmp_path)
        return
    held = {step for step, _ in killed["history"]["iteration"]}  # the steps the killed attempt logged
    want = expected_from_parquet(d)
    want["wall_time_s"] = [(step, dict(killed["history"]["wall_time_s"])[step] if step in held else v)
                           for step, v in want["wall_time_s"]]
    check_run(backend, tr, d, tmp_path, want)
    if killed_at == 6:  # the redone steps 4 and 5 kept their first wall times, which differ from the parquet's
        assert tr["history"]["wall_time_s"] != expected_from_parquet(d)["wall_time_s"]


def test_every_logger_but_none_has_a_tracker_class():
    assert set(TRACKERS) | {"none"} == set(LOGGERS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_logger_without_its_package_is_refused_before_any_work(backend, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == backend else real(name, *a))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=rf"^logger must be 'none' here: logger={backend} needs the {backend} "
                                         rf"package \(pip install -c constraints.txt -e \"\.\[{backend}\]\"\), got"):
        run(make_cfg([*CONTROL, "results_dir=res", f"logger={backend}"]))
    assert not list(tmp_path.iterdir())


def test_unknown_logger_exits_2_with_one_line_before_any_folder(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "harness", "task=cartpole", "estimator=a2c", "logger=mlfow",
                          "results_dir=res", "progress=false"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout.splitlines() == [
        "invalid config: logger must be one of ['none', 'tensorboard', 'wandb', 'mlflow'], got 'mlfow'"]
    assert [p.name for p in (tmp_path / "res").iterdir()] == [".hydra"]  # Hydra's job log; no run folder


def _open_store(root: str, barrier) -> None:
    from harness.io.trackers import MlflowLog

    barrier.wait()  # all at once, as the jobs of a joblib or Slurm sweep start
    MlflowLog(OmegaConf.create({"results_dir": root}), [])


def test_mlflow_store_created_by_several_processes_at_once(tmp_path):
    """The first job creates the SQLite tables and the experiment, the others wait (unlocked, two
    processes creating the tables together fail: ``table spans already exists``)."""
    pytest.importorskip("mlflow")
    import multiprocessing as mp

    import mlflow.tracking  # noqa: F401  imported before the fork: the children start at once

    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_open_store, args=(str(tmp_path), barrier)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert [r["name"] for r in mlflow_runs(tmp_path)] == []  # the experiment exists (once), with no runs


def test_mlflow_usage_telemetry_is_off_by_default(tmp_path):
    """``logger=mlflow`` turns MLflow's usage telemetry off (it reports to its vendor and writes
    ~/.config/mlflow/telemetry.json) unless the environment sets MLFLOW_DISABLE_TELEMETRY. The run
    has none of the variables by which MLflow turns it off by itself (pytest's, CI's), so without the
    harness's default the file is written and this fails."""
    pytest.importorskip("mlflow")
    home = tmp_path / "home"
    home.mkdir()
    quiet = ("PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS", "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK")
    env = {k: v for k, v in os.environ.items() if k not in quiet}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "harness", *CONTROL, "logger=mlflow", "results_dir=res",
                          "progress=false"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert [r["name"] for r in mlflow_runs(tmp_path / "res")]  # the run was logged
    assert not list(home.rglob("telemetry*")), list(home.rglob("*"))


def test_an_mlflow_run_is_found_again_whatever_quotes_its_name_holds(tmp_path):
    """A run is found again by its tag ``harness.run_id``; MLflow's filter grammar has no escape for
    a quote inside a string, and a task.name may hold either kind (``it's``): each run is found,
    exactly, with a name holding ', " or both."""
    pytest.importorskip("mlflow")
    from harness.io.trackers import RUN_TAG, MlflowLog

    log = MlflowLog(OmegaConf.create({"results_dir": str(tmp_path)}), [])
    names = ["it's/a/seed0-1", 'say "hi"/a/seed0-1', "both ' and \"/a/seed0-1", "plain/a/seed0-1"]
    ids = {n: log.client.create_run(log.experiment_id, tags={RUN_TAG: n}).info.run_id for n in names}
    for n in names:
        assert [r.info.run_id for r in log._find(n)] == [ids[n]], n
    assert log._find("it's") == []
