"""Hostile tracker settings and stores (``logger=tensorboard|wandb|mlflow``), through the command line's
entry (:func:`harness.app.main_entry`, or ``python -m harness`` in a subprocess) as a user meets them.

Refused before any run folder exists, one line, exit code 2: a tracking URI that is no store, a
server that does not answer, a store file that is a folder, not SQLite or locked, a wandb mode wandb
does not take or an online mode without a key or a server, an experiment name MLflow refuses, a
tracker package that fails on import. At run time a full disk under a tracker's write ends the
command in one line naming the path, exit code 1, with the runs written before it intact.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.app import main_entry
from harness.io.trackers import MLFLOW_ENV
from tests.control_helpers import make_cfg

B = ["task=cartpole", "estimator=rloo", "task.episodes_per_iter=8", "budget.iterations=1", "progress=false",
     "threads=1"]
REPO = Path(__file__).resolve().parents[1]
STORES = ("unset (the SQLite store <results_dir>/mlflow.db), sqlite:///<file>, http(s)://<tracking server> "
          "or postgresql|mysql|mssql://<database>")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    """No tracker settings from the user's environment, no ~/.netrc (HOME is a fresh folder); the
    variables the harness sets by default for MLflow restored after the test."""
    for var in [*MLFLOW_ENV, "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"]:
        monkeypatch.delenv(var, raising=False)
    for var in [v for v in os.environ if v.startswith("WANDB_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "home" / var.lower()))


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then let go): a connection to it is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


def refused(capsys, res: Path, logger: str, *extra: str, installed: bool = True) -> str:
    """``main_entry`` on a tiny run with ``logger`` (skipped without its package unless ``installed``
    is false: the caller has checked): exit code 2, one line, no traceback, no run folder below
    ``res``; returns the line."""
    if installed:
        pytest.importorskip(PACKAGES[logger])
    cfg = make_cfg([*B, f"results_dir={res}", f"logger={logger}", *extra])
    with pytest.raises(SystemExit) as info:
        main_entry(cfg)
    out = capsys.readouterr()
    assert info.value.code == 2, out
    assert "Traceback" not in out.err
    assert not (res / "cartpole").exists()
    (line,) = out.out.splitlines()
    return line


def uri_line(uri: str, problem: str) -> str:
    return f"invalid config: MLFLOW_TRACKING_URI must be {STORES} ({problem}), got {uri!r}"


# ------------------------------------------------------------------ MLFLOW_TRACKING_URI
def test_mlflow_server_that_refuses_is_refused_in_seconds_before_any_folder(tmp_path):
    """The user's command (``python -m harness``): a tracking server that does not answer, refused in
    one line within 30 s, before any run folder (MLflow's own retries, at their defaults, take minutes)."""
    pytest.importorskip("mlflow")
    uri = f"http://127.0.0.1:{closed_port()}"
    env = {k: v for k, v in os.environ.items() if k not in MLFLOW_ENV}
    env.update(MLFLOW_TRACKING_URI=uri, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "harness", *B, "logger=mlflow", "results_dir=res"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert time.monotonic() - t0 < 30
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout.splitlines() == [uri_line(uri, "no answer within 5 s: [Errno 111] Connection refused")]
    assert [p.name for p in (tmp_path / "res").iterdir()] == [".hydra"]  # Hydra's job log; no run folder


class FakeServer:
    """A local HTTP server answering every GET with ``status`` and ``body``, in a thread."""

    def __init__(self, status: int, body: str):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                self.send_response(status)
                self.send_header("Content-Type", "application/json" if body.startswith("{") else "text/html")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("status,body,problem", [
    (401, "{}", "it refused the credentials (HTTP 401; MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, "
                "or MLFLOW_TRACKING_TOKEN)"),
    (404, "<html>not here</html>", "it answered HTTP 404, not as an MLflow tracking server"),
    (500, "{}", "it answered HTTP 500, not as an MLflow tracking server"),
])
def test_mlflow_server_that_is_not_a_tracking_server_is_refused(status, body, problem, tmp_path, capsys, monkeypatch):
    pytest.importorskip("mlflow")
    with FakeServer(status, body) as server:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
        assert refused(capsys, tmp_path / "res", "mlflow") == uri_line(server.uri, problem)


@pytest.mark.parametrize("status,body", [(200, '{"experiment": {"experiment_id": "1", "name": "x"}}'),
                                         (404, '{"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no"}')])
def test_mlflow_server_that_answers_as_mlflow_passes_the_check(status, body, tmp_path, monkeypatch):
    """The experiment found, or not there yet (MLflow's own 404): the server is taken."""
    pytest.importorskip("mlflow")
    from harness.io.trackers import check_tracker

    with FakeServer(status, body) as server:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
        check_tracker(make_cfg([*B, f"results_dir={tmp_path / 'res'}", "logger=mlflow"]))


@pytest.mark.parametrize("uri,problem", [
    ("bogus://x", "not a store the harness writes to: bogus://"),
    ("file:///tmp/mlruns", "MLflow's file store takes no new runs"),
    ("mlruns", "MLflow's file store takes no new runs"),  # a plain path is MLflow's file store too
    ("sqlite://", "a file (an in-memory database keeps nothing)"),
    ("sqlite:////proc/x.db", "/proc/x.db: its folder cannot create folders in /proc (No such file or directory)"),
    ("sqlite:////proc/self/status", "/proc/self/status is not an SQLite database"),
    ("sqlite:////dev/null", "/dev/null is not a regular file"),
])
def test_mlflow_tracking_uri_that_is_no_store_is_refused(uri, problem, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert refused(capsys, tmp_path / "res", "mlflow") == uri_line(uri, problem)
    assert not (tmp_path / "res").exists()


def test_mlflow_sqlite_uri_in_a_writable_folder_is_used(tmp_path, capsys, monkeypatch):
    """The check refuses only what fails: a ``sqlite:///`` file in a folder that takes it is written."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    db = tmp_path / "elsewhere" / "store.db"
    db.parent.mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    main_entry(make_cfg([*B, f"results_dir={tmp_path / 'res'}", "logger=mlflow"]))
    exp = MlflowClient(f"sqlite:///{db}").get_experiment_by_name(str(tmp_path / "res"))
    (tr,) = MlflowClient(f"sqlite:///{db}").search_runs([exp.experiment_id])
    assert tr.info.status == "FINISHED"
    assert not (tmp_path / "res" / "mlflow.db").exists()


def test_mlflow_database_uri_without_a_server_is_refused(tmp_path, capsys, monkeypatch):
    """A database store: its driver must import and its host take a connection within 5 s."""
    pytest.importorskip("mlflow")
    port = closed_port()
    uri = f"mysql+pymysql://u:p@127.0.0.1:{port}/db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    line = refused(capsys, tmp_path / "res", "mlflow")
    try:
        import pymysql  # noqa: F401
    except ImportError:
        assert line == uri_line(uri, "ModuleNotFoundError: No module named 'pymysql'")
    else:
        assert line == uri_line(uri, f"no connection to 127.0.0.1:{port} within 5 s: Connection refused")


# ------------------------------------------------------------------ the experiment's name
def test_mlflow_experiment_name_over_mlflows_limit_is_refused_shortened(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "e" * 100_000)
    assert refused(capsys, tmp_path / "res", "mlflow") == (
        "invalid config: MLFLOW_EXPERIMENT_NAME must be a name MLflow takes for the experiment ('name' exceeds "
        f"the maximum length of 500 characters) with logger=mlflow, got '{'e' * 60}... (100000 characters)'")


def test_results_dir_too_long_to_name_the_mlflow_experiment_is_refused(tmp_path, capsys):
    """Without MLFLOW_EXPERIMENT_NAME the experiment is named by results_dir's absolute path: one
    longer than MLflow's 500 characters is refused naming results_dir."""
    res = tmp_path / ("d" * 200) / ("d" * 200) / ("d" * 200)
    line = refused(capsys, res, "mlflow")
    assert line == ("invalid config: results_dir must be a name MLflow takes for the experiment ('name' exceeds the "
                    f"maximum length of 500 characters) with logger=mlflow, got '{str(res)[:60]}... "
                    f"({len(str(res))} characters)'")
    assert not (tmp_path / ("d" * 200)).exists()


# ------------------------------------------------------------------ a damaged or locked store
def store_line(res: Path, problem: str) -> str:
    return (f"invalid config: results_dir must be a folder whose mlflow.db is an SQLite store the harness can "
            f"write, or absent, with logger=mlflow ({problem}), got '{res}'")


def test_mlflow_store_that_is_a_folder_is_refused(tmp_path, capsys):
    res = tmp_path / "res"
    (res / "mlflow.db").mkdir(parents=True)
    assert refused(capsys, res, "mlflow") == store_line(res, f"{res}/mlflow.db is a folder, not an SQLite file")


def test_mlflow_store_that_is_not_sqlite_is_refused_and_kept(tmp_path, capsys):
    res = tmp_path / "res"
    res.mkdir()
    (res / "mlflow.db").write_text("my notes\n")
    assert refused(capsys, res, "mlflow") == store_line(res, f"{res}/mlflow.db is not an SQLite database")
    assert (res / "mlflow.db").read_text() == "my notes\n"


def test_mlflow_store_of_another_program_is_refused_and_kept(tmp_path, capsys):
    """An SQLite database without MLflow's tables: MLflow would add its own to it."""
    res = tmp_path / "res"
    res.mkdir()
    with sqlite3.connect(res / "mlflow.db") as con:
        con.execute("CREATE TABLE notes (body TEXT)")
    con.close()
    before = (res / "mlflow.db").read_bytes()
    assert refused(capsys, res, "mlflow") == store_line(
        res, f"{res}/mlflow.db holds another program's tables (notes), not MLflow's")
    assert (res / "mlflow.db").read_bytes() == before


def test_mlflow_store_locked_by_another_connection_is_refused_after_the_wait(tmp_path, capsys):
    """Another connection holds the store's exclusive lock: refused after 5 s (SQLite's own wait)."""
    res = tmp_path / "res"
    res.mkdir()
    holder = sqlite3.connect(res / "mlflow.db", isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        t0 = time.monotonic()
        line = refused(capsys, res, "mlflow")
        assert 5 <= time.monotonic() - t0 < 20
    finally:
        holder.close()
    assert line == store_line(res, f"{res}/mlflow.db is locked by another process (waited 5 s)")


# ------------------------------------------------------------------ wandb's environment
def test_wandb_mode_wandb_does_not_take_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "bogus")
    assert refused(capsys, tmp_path / "res", "wandb") == (
        "invalid config: WANDB_MODE must be a value wandb takes (Input should be 'online', 'offline', 'shared', "
        "'disabled', 'dryrun' or 'run'), got 'bogus'")


def test_wandb_project_wandb_does_not_take_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_PROJECT", "a/b")
    assert refused(capsys, tmp_path / "res", "wandb") == (
        "invalid config: WANDB_PROJECT must be a value wandb takes (Invalid project name 'a/b': cannot contain "
        "characters '/,\\\\,#,?,%,:', found '/'), got 'a/b'")


def test_wandb_online_without_an_api_key_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    assert refused(capsys, tmp_path / "res", "wandb") == (
        "invalid config: WANDB_MODE must be offline (the default) or disabled without a W&B API key; online needs "
        "one (WANDB_API_KEY, or `wandb login`), got 'online'")


def test_wandb_online_with_a_server_that_refuses_is_refused(tmp_path, capsys, monkeypatch):
    url = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", url)
    line = refused(capsys, tmp_path / "res", "wandb")
    assert line == (f"invalid config: WANDB_BASE_URL must be a W&B server that answers within 5 s with "
                    f"WANDB_MODE=online ([Errno 111] Connection refused), or WANDB_MODE=offline, got '{url}'")


def test_wandb_api_key_of_the_wrong_form_is_refused_unshown(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_API_KEY", "secret")
    line = refused(capsys, tmp_path / "res", "wandb")
    assert line == ("invalid config: WANDB_API_KEY must be a W&B API key (API key must have 40+ characters, "
                    "has 6.), got '<6 characters>'")


# ------------------------------------------------------------------ a package broken on import
@pytest.mark.parametrize("logger,package,module", [("mlflow", "mlflow", "mlflow.tracking"), ("wandb", "wandb", "wandb"),
                                                   ("tensorboard", "tensorboard", "torch.utils.tensorboard")])
def test_tracker_package_that_fails_on_import_is_named(logger, package, module, tmp_path, capsys, monkeypatch):
    """The package is installed (found) but raises on import, as a half-installed one does: a package
    of that name first on sys.path, the real one out of sys.modules for the test."""
    pytest.importorskip(package)
    fake = tmp_path / "site" / package
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise RuntimeError('half-installed: libfoo.so missing')\n")
    for name in [n for n in sys.modules if n.split(".")[0] == package or n.startswith("torch.utils.tensorboard")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(fake.parent))
    assert refused(capsys, tmp_path / "res", logger, installed=False) == (
        f"invalid config: logger must be 'none' here: logger={logger} needs a working {package} package (import "
        f"{module} failed: RuntimeError: half-installed: libfoo.so missing), got '{logger}'")


# ------------------------------------------------------------------ a full disk under a tracker's write
def finished_run(res: Path) -> tuple[Path, dict, bytes]:
    """The one finished run below ``res``: its folder, summary and metrics bytes."""
    (summary,) = res.rglob("summary.json")
    return summary.parent, json.loads(summary.read_text()), (summary.parent / "metrics.parquet").read_bytes()


# the writer thread's error is raised by the writer's next call, not printed from the thread as well
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_disk_full_under_tensorboard_names_the_folder_earlier_run_intact(tmp_path, capsys, monkeypatch):
    """TensorBoard's writer thread fails as on a full disk (``ENOSPC``, naming no file): the command
    ends in one line naming the run's tb/ folder, exit code 1; the run written before is untouched."""
    pytest.importorskip("tensorboard")
    from tensorboard.summary.writer.record_writer import RecordWriter

    import threading

    hook = threading.excepthook
    res = tmp_path / "res"
    main_entry(make_cfg([*B, f"results_dir={res}", "logger=tensorboard", "seed=0"]))
    first, summary, metrics = finished_run(res)
    events = {p: p.read_bytes() for p in (first / "tb").iterdir()}

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RecordWriter, "write", full)
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main_entry(make_cfg([*B, f"results_dir={res}", "logger=tensorboard", "seed=1"]))
    assert info.value.code == 1
    (second,) = [p for p in (res / "cartpole" / "rloo").iterdir() if p != first]
    out = capsys.readouterr()
    assert out.out.splitlines() == [f"cannot write results: {second / 'tb'}: No space left on device"]
    assert "Traceback" not in out.err
    assert json.loads((second / "summary.json").read_text())["reason"] == f"{second / 'tb'}: No space left on device"
    assert finished_run(res / "cartpole" / "rloo" / first.name)[1:] == (summary, metrics)
    assert {p: p.read_bytes() for p in (first / "tb").iterdir()} == events
    assert threading.excepthook is hook  # put back when the writers closed


def test_disk_full_in_the_mlflow_store_names_it_earlier_run_intact(tmp_path, capsys, monkeypatch):
    """The SQLite store cannot grow (``PRAGMA max_page_count`` at its size: SQLite's own ``database or
    disk is full``, as on a full disk): one line naming mlflow.db, exit code 1; the run written
    before is untouched, in its folder and in the store."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from sqlalchemy import event
    from sqlalchemy.pool import Pool

    res = tmp_path / "res"
    main_entry(make_cfg([*B, f"results_dir={res}", "logger=mlflow", "seed=0"]))
    first, summary, metrics = finished_run(res)
    client = MlflowClient(f"sqlite:///{res}/mlflow.db")
    (exp,) = [e for e in client.search_experiments() if e.name == str(res)]

    def history(run):
        return {k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)] for k in run.data.metrics}

    (before,) = client.search_runs([exp.experiment_id])
    with sqlite3.connect(res / "mlflow.db") as con:
        pages = con.execute("PRAGMA page_count").fetchone()[0]

    def cap(dbapi_connection, record, proxy):
        dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")

    event.listen(Pool, "checkout", cap)
    try:
        capsys.readouterr()
        with pytest.raises(SystemExit) as info:
            main_entry(make_cfg([*B, f"results_dir={res}", "logger=mlflow", "seed=1"]))
    finally:
        event.remove(Pool, "checkout", cap)
    assert info.value.code == 1
    out = capsys.readouterr()
    assert out.out.splitlines() == [f"cannot write results: {res / 'mlflow.db'}: No space left on device"]
    assert "Traceback" not in out.err
    assert finished_run(res / "cartpole" / "rloo" / first.name)[1:] == (summary, metrics)
    (kept,) = [r for r in client.search_runs([exp.experiment_id]) if r.info.run_id == before.info.run_id]
    assert kept.info.status == "FINISHED" and history(kept) == history(before)


def test_mlflow_http_knobs_default_short_and_the_users_kept(tmp_path, capsys, monkeypatch):
    """MLflow's own retry and timeout variables are set short for the run unless the user set them."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "77")
    main_entry(make_cfg([*B, f"results_dir={tmp_path / 'res'}", "logger=mlflow"]))
    assert {k: os.environ[k] for k in MLFLOW_ENV} == {
        "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "77"}


def test_probe_mode_checks_no_tracker(tmp_path, monkeypatch):
    """``mode=probe`` runs no training loop, so no tracker: its settings are not checked."""
    pytest.importorskip("mlflow")
    from harness.io.trackers import check_tracker

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "bogus://x")
    check_tracker(make_cfg([*B, f"results_dir={tmp_path / 'res'}", "logger=mlflow", "mode=probe"]))
    with pytest.raises(ValueError, match="^MLFLOW_TRACKING_URI must be "):
        check_tracker(make_cfg([*B, f"results_dir={tmp_path / 'res'}", "logger=mlflow"]))
