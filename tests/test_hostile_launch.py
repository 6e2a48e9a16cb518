"""Hostile input at launch and at write time: each refused in one line, nothing written.

- ``hydra/launcher=ray`` / ``ray_cluster`` pointed at an address where no Ray cluster answers (a
  closed port, an unresolvable host, ``auto`` with no cluster, not ``host:port``, a stopped
  cluster ``ray start`` recorded): exit 2 with one line naming ``hydra.launcher.ray.init.address``
  and where the address came from, within 30 s, no folder made
  (``harness.callbacks.refuse_unreachable_ray_cluster``; ``ray.init`` would retry for minutes).
- ``recipe=<name>`` beside ``estimator=...``: the run's config.yaml records the recipe
  (``recipe: <name>``, its last line); the recipe's name is not hashed (the run folder is the one
  of the same settings without the record), and a run without a recipe writes no such key.
- A full disk (ENOSPC, simulated: every ``fsync`` fails as a full disk fails it) under
  ``python -m analysis report --out``, ``claims`` and ``rliable`` (and ``mkstemp`` refused, and
  ``claims --publish``'s figures): exit 1 with one line naming the file (``cannot write <file>:
  No space left on device``), no file written.
"""
from __future__ import annotations

import errno
import os
import re
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from .analysis_fixtures import make_sweep
from .test_launchers import REPO, has_plugin

NEEDS_RAY = pytest.mark.skipif(not has_plugin("hydra_ray_launcher"),
                               reason="hydra-ray-launcher not installed (ray extra)")
B = ["task=cartpole", "estimator=rloo", "task.episodes_per_iter=8", "budget.iterations=1"]
ADDRESS_RULE = ("invalid config: hydra.launcher.ray.init.address must be a running Ray cluster's address "
                "(host:port of its head, ray://host:port, auto: the cluster this node's `ray start` joined; "
                "null or local: a new local instance), got ")


def cli(args: list[str], cwd: Path, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """``python -m harness ARGS`` in ``cwd`` (this checkout's harness, ``env`` added to the
    environment without RAY_ADDRESS); the result and its seconds."""
    extra = env or {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)  # only ``env`` says where a cluster is
    env.update(extra)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    return out, time.perf_counter() - t0


def closed_port() -> int:
    """A TCP port on this machine nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ Ray: no cluster at the address
@NEEDS_RAY
@pytest.mark.parametrize("launcher, address, reason", [
    ("ray_cluster", "127.0.0.1:{port}", ":{port} within 5 s: Connection refused"),
    ("ray_cluster", "nosuchhost.invalid:6379", "no connection to nosuchhost.invalid:6379 within 5 s: "),
    ("ray", "ray://127.0.0.1:{port}", "no connection to 127.0.0.1:{port} within 5 s: Connection refused"),
])
def test_a_ray_address_nobody_answers_is_one_line_and_writes_nothing(launcher, address, reason, tmp_path):
    port = closed_port()
    address, reason = address.format(port=port), reason.format(port=port)
    extra = ["+hydra.launcher.ray.init.object_store_memory=null"] if launcher == "ray" else []
    out, seconds = cli(["-m", *B, f"hydra/launcher={launcher}", f"hydra.launcher.ray.init.address={address}",
                        *extra, "results_dir=res"], tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{ADDRESS_RULE}{address!r}: "), out.stdout + out.stderr
    assert reason in lines[0], lines[0]
    assert "Traceback" not in out.stderr
    assert seconds < 30
    assert list(tmp_path.iterdir()) == []  # no results_dir, no Hydra sweep folder


@NEEDS_RAY
def test_ray_address_from_the_environment_is_named(tmp_path):
    """``address: auto`` reads RAY_ADDRESS (as ``ray.init`` does): the line names where it came from."""
    port = closed_port()
    out, _ = cli(["-m", *B, "hydra/launcher=ray_cluster", "results_dir=res"], tmp_path,
                 env={"RAY_ADDRESS": f"nosuchhost.invalid:{port}"})
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout == (f"{ADDRESS_RULE}'nosuchhost.invalid:{port}' from RAY_ADDRESS: "
                          f"no connection to nosuchhost.invalid:{port} within 5 s: Name or service not known\n")
    assert list(tmp_path.iterdir()) == []


@NEEDS_RAY
def test_a_stopped_cluster_ray_start_recorded_is_named(tmp_path):
    """Plain ``hydra/launcher=ray`` (address null) connects to the cluster the last ``ray start``
    on this machine recorded in Ray's temp folder, as ``ray.init`` does: one that no longer runs is
    refused by its file, before the local object-store default is (which it would make moot)."""
    port, ray_tmp, work = closed_port(), tmp_path / "raytmp", tmp_path / "work"
    (ray_tmp / "ray").mkdir(parents=True)
    (ray_tmp / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}\n")
    work.mkdir()
    out, seconds = cli(["-m", *B, "hydra/launcher=ray", "results_dir=res"], work, env={"RAY_TMPDIR": str(ray_tmp)})
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1, out.stdout + out.stderr
    assert lines[0].startswith(f"{ADDRESS_RULE}'127.0.0.1:{port}' from {ray_tmp / 'ray' / 'ray_current_cluster'}: "
                               "no connection to "), lines[0]
    assert lines[0].endswith(f":{port} within 5 s: Connection refused") and seconds < 30
    assert list(work.iterdir()) == []


def ray_cfg(address) -> OmegaConf:
    return OmegaConf.create({"hydra": {"launcher": {
        "_target_": "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher",
        "ray": {"init": {"address": address, "object_store_memory": None}, "remote": {}}}}})


@pytest.fixture
def fake_ray(monkeypatch):
    """Ray's address function as a stand-in (Ray is an optional extra): ``auto`` finds no cluster,
    a local host becomes the node's address, a name without a port is refused, as Ray 2.60's
    ``ray._private.services.canonicalize_bootstrap_address`` does."""
    def canonicalize_bootstrap_address(addr, temp_dir=None):
        if addr == "auto":
            raise ConnectionError("Could not find any running Ray instance.")
        if ":" not in addr:
            raise ValueError(f"Invalid address format: {addr}")
        host, port = addr.rsplit(":", 1)
        return f"{'10.1.2.3' if host == '127.0.0.1' else host}:{port}"

    services = types.ModuleType("ray._private.services")
    services.canonicalize_bootstrap_address = canonicalize_bootstrap_address
    for name, module in (("ray", types.ModuleType("ray")), ("ray._private", types.ModuleType("ray._private")),
                         ("ray._private.services", services)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


@pytest.fixture
def connects(monkeypatch):
    """``socket.create_connection`` recorded: each (host, port, timeout); ``fail`` sets what it raises."""
    calls: list = []
    state = {"fail": None}

    def create_connection(address, timeout=None, *args, **kwargs):
        calls.append((*address, timeout))
        if state["fail"] is not None:
            raise state["fail"]
        return types.SimpleNamespace(close=lambda: None)

    monkeypatch.setattr(socket, "create_connection", create_connection)
    return calls, state


@pytest.mark.parametrize("address, fail, probed, problem", [
    ("auto", None, [], "Could not find any running Ray instance."),
    ("10.9.9.9:6379", TimeoutError("timed out"), [("10.9.9.9", 6379, 5.0)],
     "no connection to 10.9.9.9:6379 within 5 s: timed out"),
    ("127.0.0.1:6379", ConnectionRefusedError(111, "Connection refused"), [("10.1.2.3", 6379, 5.0)],
     "no connection to 10.1.2.3:6379 within 5 s: Connection refused"),
    ("ray://head:10001", socket.gaierror(-2, "Name or service not known"), [("head", 10001, 5.0)],
     "no connection to head:10001 within 5 s: Name or service not known"),
    ("headnode", None, [], "Invalid address format: headnode"),
    ("head:port", None, [], "'head:port' is not host:port"),
    ("head:70000", None, [], "'head:70000' is not host:port"),
])
def test_ray_address_refused_with_the_fake_ray(address, fail, probed, problem, fake_ray, connects, capsys):
    from harness.callbacks import refuse_bad_launcher

    calls, state = connects
    state["fail"] = fail
    with pytest.raises(SystemExit) as exit_:
        refuse_bad_launcher(ray_cfg(address))
    assert exit_.value.code == 2
    assert capsys.readouterr().out == f"{ADDRESS_RULE}{address!r}: {problem}\n"
    assert calls == probed


@pytest.mark.parametrize("address, env, probed", [
    ("10.9.9.9:6379", None, [("10.9.9.9", 6379, 5.0)]),  # a cluster that answers
    ("auto", "10.9.9.8:6379", [("10.9.9.8", 6379, 5.0)]),  # auto reads RAY_ADDRESS
    (None, None, []),  # a new local instance: nothing to reach
    ("local", "10.9.9.8:6379", []),  # local never reads RAY_ADDRESS
])
def test_ray_address_that_answers_or_a_local_instance_passes(address, env, probed, fake_ray, connects,
                                                              monkeypatch, capsys):
    from harness.callbacks import refuse_unreachable_ray_cluster

    if env:
        monkeypatch.setenv("RAY_ADDRESS", env)
    refuse_unreachable_ray_cluster(ray_cfg(address))
    assert capsys.readouterr().out == ""
    assert connects[0] == probed


def test_ray_address_probed_as_it_is_without_ray(connects, monkeypatch, capsys):
    """Without Ray installed the address is not rewritten: the probe connects to it as given."""
    from harness.callbacks import refuse_unreachable_ray_cluster

    monkeypatch.setitem(sys.modules, "ray._private.services", None)  # import raises ImportError
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    calls, state = connects
    state["fail"] = ConnectionRefusedError(111, "Connection refused")
    with pytest.raises(SystemExit):
        refuse_unreachable_ray_cluster(ray_cfg("127.0.0.1:6379"))
    assert calls == [("127.0.0.1", 6379, 5.0)]
    assert capsys.readouterr().out.endswith(": no connection to 127.0.0.1:6379 within 5 s: Connection refused\n")


def test_a_listening_port_passes_the_probe():
    from harness.callbacks import ray_cluster_problem

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        assert ray_cluster_problem(f"ray://127.0.0.1:{s.getsockname()[1]}") is None


# ------------------------------------------------------------------ the recipe recorded in config.yaml
def test_a_recipe_is_recorded_in_config_yaml_and_not_hashed(tmp_path):
    from harness.io.rundir import run_dir_for
    from harness.testing import compose

    toy = ["task=toy", "estimator=rloo", "budget.iterations=1", "progress=false", "results_dir=res"]
    out, _ = cli([*toy, "recipe=verl_grpo"], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    out, _ = cli(toy, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    made = sorted(p.parent.relative_to(tmp_path) for p in tmp_path.glob("res/toy/rloo/*/config.yaml"))
    # the folders of the same compositions without Hydra's record of a choice: the recipe's name is not hashed
    expected = [run_dir_for(compose(c)) for c in ([*toy, "recipe=verl_grpo"], toy)]
    assert made == sorted(expected) and len(made) == 2
    with_recipe, without = (tmp_path / folder / "config.yaml" for folder in expected)
    text = with_recipe.read_text()
    assert text.endswith("\nrecipe: verl_grpo\n")
    settings = yaml.safe_load(text)  # verl_grpo.yaml's update and clip_ratio_c, the command line's estimator
    assert (settings["estimator"], settings["update"], settings["clip_ratio_c"]) == ("rloo", "dual_clip", 3.0)
    assert "recipe" not in yaml.safe_load(without.read_text())


def test_recording_a_recipe_changes_no_hash_and_no_recipe_changes_nothing():
    from harness.app import record_recipe
    from harness.io import config_hash
    from harness.testing import compose

    cfg = compose(["task=toy", "estimator=grpo"])
    text, digest = OmegaConf.to_yaml(cfg), config_hash(cfg)
    assert digest == "80604a49ef"  # pinned in tests/test_checkpoint.py before recipes existed
    record_recipe(cfg, None)
    assert (OmegaConf.to_yaml(cfg), config_hash(cfg)) == (text, digest)
    record_recipe(cfg, "verl_grpo")
    assert OmegaConf.to_yaml(cfg) == text + "recipe: verl_grpo\n"
    assert config_hash(cfg) == digest


# ------------------------------------------------------------------ a full disk under analysis's outputs
#: Python run as ``python -c``: every ``os.fsync`` fails as on a full disk, then ``python -m analysis ARGS``
DISK_FULL_MAIN = ("import errno, os, runpy, sys\n"
                  "def full(fd): raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
                  "os.fsync = full\n"
                  "sys.argv = ['analysis', *sys.argv[1:]]\n"
                  "runpy.run_module('analysis', run_name='__main__')\n")


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def one_disk_full_line(err: str, command: str, out: Path) -> Path:
    """The one line of a full disk, and the file it names (under ``out``)."""
    lines = err.splitlines()
    assert len(lines) == 1, err
    m = re.fullmatch(rf"python -m analysis {command}: error: cannot write (.+): No space left on device", lines[0])
    assert m, lines[0]
    named = Path(m.group(1))
    assert named.is_relative_to(out) and not named.exists(), named
    return named


def test_analysis_report_on_a_full_disk_is_one_line_exit_1(tmp_path):
    results, out = make_sweep(tmp_path / "res", seeds=(0, 1)), tmp_path / "out"
    before = files_under(results)
    env = {**os.environ, "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-c", DISK_FULL_MAIN, "report", str(results), "--out", str(out),
                           "--reps", "20"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    one_disk_full_line(done.stderr, "report", out)
    assert "Traceback" not in done.stdout + done.stderr
    assert files_under(out) == [] and files_under(results) == before  # no output, no temp file, the runs intact


@pytest.fixture
def disk_full(monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)


def test_analysis_claims_on_a_full_disk_is_one_line_exit_1(tmp_path, disk_full, capsys):
    from analysis.cli import main

    root = tmp_path / "claims"
    root.mkdir()
    (root / "exact_tests.json").write_text("{}")  # a claims folder
    assert main(["claims", str(root), "--only", "C3"]) == 1
    one_disk_full_line(capsys.readouterr().err, "claims", root)
    assert files_under(root) == [root / "exact_tests.json"]


def test_analysis_rliable_on_a_full_disk_is_one_line_exit_1(tmp_path, disk_full, capsys):
    from analysis.cli import main

    results, out = make_sweep(tmp_path / "res", seeds=(0, 1)), tmp_path / "out" / "scores.npz"
    assert main(["rliable", str(results), "--out", str(out)]) == 1
    assert one_disk_full_line(capsys.readouterr().err, "rliable", out.parent) == out
    assert files_under(out.parent) == []


def test_another_os_error_is_not_called_a_full_disk(tmp_path, monkeypatch):
    """Only a full disk (or quota) is worded so: any other error while writing is raised as it is."""
    from analysis.cli import main

    def broken(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", broken)
    results = make_sweep(tmp_path / "res", seeds=(0, 1))
    with pytest.raises(OSError, match="Input/output error"):
        main(["rliable", str(results), "--out", str(tmp_path / "out" / "scores.npz")])


def test_published_claims_figures_on_a_full_disk_name_the_figure(tmp_path, monkeypatch):
    """``claims --publish`` copies the figures file by file through the atomic write: the disk filling
    up at a figure names that figure (a tree copy would raise shutil.Error, naming none)."""
    from analysis.claims.report import publish
    from tests.claims_helpers import report_without_runs

    report_without_runs(tmp_path, monkeypatch)
    fsync = os.fsync

    def full_at_figures(fd):  # the page fits, the figure does not (its temp file: .c3.png.<random>.tmp)
        if ".png." in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return fsync(fd)

    monkeypatch.setattr(os, "fsync", full_at_figures)
    dest = tmp_path / "docs"
    with pytest.raises(OSError) as failed:
        publish(tmp_path, False, dest, "python -m analysis claims R --publish P")
    assert (failed.value.errno, failed.value.filename) == (errno.ENOSPC, str(dest / "claims_figures" / "c3.png"))
    assert files_under(dest) == [dest / "claims.md"]


def test_a_full_disk_refusing_the_temp_file_names_the_output(tmp_path, monkeypatch, capsys):
    """A full disk can refuse the temp file itself (no inode, no directory block): the line names
    the output, not the temp file's random name."""
    import tempfile

    from analysis.cli import main

    results, out = make_sweep(tmp_path / "res", seeds=(0, 1)), tmp_path / "out" / "scores.npz"

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out.parent / ".scores.npz.x1y2.tmp"))

    monkeypatch.setattr(tempfile, "mkstemp", full)
    assert main(["rliable", str(results), "--out", str(out)]) == 1
    assert one_disk_full_line(capsys.readouterr().err, "rliable", out.parent) == out
