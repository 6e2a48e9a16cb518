"""A sweep on a Ray *cluster*, not only a local Ray instance (issue 37 item 4; docs/ray.md).

- :func:`test_sweep_lands_on_both_nodes_of_a_two_node_ray_cluster`: on this one machine a head
  and a second node (``ray start --head`` / ``ray start --address=HEAD``, 1 CPU each, their own
  temp dirs, ports and auth token), a 4-job sweep with ``hydra/launcher=ray_cluster``
  (``address: auto``, found through ``RAY_ADDRESS``); each job's ``outcome.json`` names the Ray
  node it ran on: the two node ids ``ray status`` lists, each run completed with its
  metrics.parquet rows. The cluster is stopped by the ids of the processes this test started
  (never ``ray stop``: it stops every Ray process on the machine, other sweeps' too), also
  when the test fails.
- Without Ray, ``outcome.json`` still says where the job ran (the hostname), and the
  end-of-sweep summary reads the new and the old ``outcome.json`` alike.
- ``hydra/launcher=ray`` pointed at a cluster with the plugin's local object-store default is
  refused in one line (Ray's ValueError after the sweep started, otherwise).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from .test_launchers import REPO, TINY_CLI, has_plugin, harness_cli, run_dirs

#: Ray's command line: the one installed beside this Python (a virtual environment's bin/), else on PATH
RAY = Path(sys.executable).with_name("ray")
RAY = RAY if RAY.exists() else Path(shutil.which("ray") or RAY)
NEEDS_RAY = pytest.mark.skipif(not has_plugin("hydra_ray_launcher"),
                               reason="hydra-ray-launcher not installed (ray extra)")
NODE_ID = re.compile(r"\bnode_([0-9a-f]{56})\b")
OBJECT_STORE = str(80 * 2**20)  # bytes per node: Ray's floor is 75 MB; the machine has 24 GiB, 2 cores


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports nothing listens on now (bound at once, then released)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("", 0))
        return [s.getsockname()[1] for s in socks]


def node_ports(ports: list[int]) -> list[str]:
    """The ports one node opens besides the head's GCS port, all chosen here so that nothing
    clashes with another Ray instance on the machine (another test's, another engineer's)."""
    names = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
             "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port"]
    args = [f"{name}={ports.pop()}" for name in names]
    return [*args, "--worker-port-list=" + ",".join(str(ports.pop()) for _ in range(8))]


class TwoNodeCluster:
    """A head and one more node on this machine, each ``ray start --block`` run by this process
    in a session of its own; :meth:`stop` ends exactly those (SIGTERM, which ``--block`` turns
    into stopping the node's own processes, then SIGKILL to what is left of each session)."""

    def __init__(self, root: Path):
        self.root = root
        token = root / "auth_token"
        token.write_text(secrets.token_hex(32))
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                    "RAY_USAGE_STATS_ENABLED": "0",
                    "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        self.env.pop("RAY_ADDRESS", None)
        self.procs: list[subprocess.Popen] = []
        self.address = ""
        self.nodes: set[str] = set()  # the alive nodes' ids once started

    def start_node(self, name: str, args: list[str]) -> None:
        log = open(self.root / f"{name}.log", "w")
        self.procs.append(subprocess.Popen(
            [str(RAY), "start", "--block", "--num-cpus=1", f"--object-store-memory={OBJECT_STORE}",
             f"--temp-dir={self.root / name}", "--disable-usage-stats", *args],
            cwd=self.root, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        log.close()

    def start(self) -> None:
        """The head, then the second node: started at once, they compete for the 2 cores and a
        raylet can miss Ray's fixed 30 s to register (``The current node timed out during
        startup``, seen here with other work on the machine)."""
        ports = free_ports(1 + 1 + 2 * 14)
        self.address = f"127.0.0.1:{ports.pop()}"
        self.env["RAY_ADDRESS"] = self.address
        local = "--node-ip-address=127.0.0.1"
        self.start_node("head", ["--head", local, f"--port={self.address.rsplit(':', 1)[1]}",
                                 "--include-dashboard=false", f"--ray-client-server-port={ports.pop()}",
                                 *node_ports(ports)])
        self.wait(lambda: "Ray runtime started" in (self.root / "head.log").read_text(), "the head")
        self.start_node("node2", [local, f"--address={self.address}", *node_ports(ports)])
        self.wait(lambda: "Ray runtime started" in (self.root / "node2.log").read_text(), "the second node")

        def both_registered() -> bool:
            self.nodes = self.nodes_now()
            return len(self.nodes) == 2

        self.wait(both_registered, "the second node's registration")

    def wait(self, ready, what: str, timeout_s: float = 60) -> None:
        end = time.monotonic() + timeout_s
        while not ready():
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > end:
                logs = "\n".join(f.read_text()[-2000:] for f in sorted(self.root.glob("*.log")))
                raise AssertionError(f"{what} did not start ({'exited: ' + str(dead) if dead else 'timeout'})\n{logs}")
            time.sleep(0.5)

    def nodes_now(self) -> set[str]:
        """The ids of the cluster's alive nodes, as ``ray status`` lists them (``node_<id>``)."""
        out = subprocess.run([str(RAY), "status", f"--address={self.address}"], env=self.env,
                             capture_output=True, text=True, timeout=60, check=False).stdout
        active = out.split("Active:", 1)[-1].split("Pending:", 1)[0] if "Active:" in out else ""
        return set(NODE_ID.findall(active))

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            try:  # the node's raylet, GCS, workers: this session's, started by this test
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if p.poll() is None:
                p.wait(timeout=10)


#: Ray's own words when a node's raylet did not register within its fixed 30 s (a busy machine)
RAY_STARTUP_TIMEOUT = "The current node timed out during startup"


@pytest.fixture
def ray_cluster():
    """The started cluster; stopped afterwards whatever happened. A start that ran into
    :data:`RAY_STARTUP_TIMEOUT` is tried once more (new ports, new folders); any other failure
    to start fails the test with the nodes' logs."""
    for attempt in (1, 2):
        # a short folder: Ray's Unix sockets live under --temp-dir (a path of at most 107 bytes)
        root = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
        cluster = TwoNodeCluster(root)
        try:
            try:
                cluster.start()
            except AssertionError as exc:
                if attempt == 1 and RAY_STARTUP_TIMEOUT in str(exc):
                    continue  # the finally below stops this try's nodes first
                raise
            yield cluster
            return
        finally:
            cluster.stop()
            shutil.rmtree(root, ignore_errors=True)


def outcomes(results: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted(results.glob(".hydra/sweeps/*/*/outcome.json"))]


@pytest.mark.slow
@NEEDS_RAY
def test_sweep_lands_on_both_nodes_of_a_two_node_ray_cluster(ray_cluster, tmp_path, monkeypatch):
    nodes = ray_cluster.nodes  # as `ray status` lists them
    assert len(nodes) == 2, nodes
    results = tmp_path / "res"  # absolute: the jobs run in the nodes' own working folders
    args = ["-m", "estimator=reinforce,a2c", "seed=0,1", *[a for a in TINY_CLI if not a.startswith("seed=")],
            f"results_dir={results}", "hydra/launcher=ray_cluster"]
    for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_USAGE_STATS_ENABLED"):
        monkeypatch.setenv(k, ray_cluster.env[k])  # address: auto finds the cluster through RAY_ADDRESS
    out = harness_cli(args, tmp_path, timeout=300)
    text = out.stdout + out.stderr
    assert f"Using address {ray_cluster.address} set in the environment variable RAY_ADDRESS" in text, text
    assert "Connected to Ray cluster." in text and "Started a local Ray instance" not in text, text
    assert "sweep done: 4 completed" in out.stdout, text

    jobs = outcomes(results)
    assert len(jobs) == 4 and all(j["completed"] == 1 for j in jobs), jobs
    ran_on = [j["ran_on"]["ray_node_id"] for j in jobs]
    assert set(ran_on) == nodes  # both nodes ran jobs, and only the cluster's nodes
    assert all(j["ran_on"]["host"] == socket.gethostname() for j in jobs)
    listed = ", ".join(f"{n} ({ran_on.count(n)} job{'s' if ran_on.count(n) > 1 else ''})" for n in sorted(nodes))
    assert f"[harness] jobs ran on 2 Ray nodes: {listed}" in out.stdout, out.stdout

    runs = run_dirs(results)  # the runs themselves: finished, every iteration's metrics row there
    assert sorted((k.split("/")[1], k.split("/")[2].split("-")[0]) for k in runs) == sorted(
        (e, f"seed{s}") for e in ("reinforce", "a2c") for s in (0, 1))
    assert len(runs) == 4 and all(v == ("completed", 2) for v in runs.values()), runs


# ------------------------------------------------------------------ without Ray (fast)
def test_outcome_names_the_host_outside_ray(tmp_path, monkeypatch):
    from hydra.core.hydra_config import HydraConfig

    from harness.app import where_job_ran, write_outcome

    monkeypatch.delitem(sys.modules, "ray", raising=False)  # a job of the basic or joblib launcher
    assert where_job_ran() == {"host": socket.gethostname(), "ray_node_id": None}
    cfg = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(tmp_path)}}})
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: cfg.hydra))
    write_outcome({"skipped": 0, "completed": 1})
    assert json.loads((tmp_path / "outcome.json").read_text()) == {
        "skipped": 0, "completed": 1, "ran_on": {"host": socket.gethostname(), "ray_node_id": None}}


def test_sweep_summary_counts_and_lists_the_ray_nodes(tmp_path, capsys):
    from harness.callbacks import SweepSummary

    written = {"0": {"completed": 1, "ran_on": {"host": "a", "ray_node_id": "n1"}},
               "1": {"completed": 1, "skipped": 0, "ran_on": {"host": "a", "ray_node_id": "n2"}},
               "2": {"failed": 1, "ran_on": {"host": "b", "ray_node_id": "n1"}},
               "3": {"skipped": 1},  # written before outcome.json said where (or by an older harness)
               "4": {"completed": 1, "ran_on": {"host": "c", "ray_node_id": None}}}  # not on Ray
    for job, outcome in written.items():
        (tmp_path / job).mkdir()
        (tmp_path / job / "outcome.json").write_text(json.dumps(outcome))
    cfg = OmegaConf.create({"results_dir": "res", "hydra": {"sweep": {"dir": str(tmp_path)}}})
    with pytest.raises(SystemExit) as exit_:  # one job failed
        SweepSummary().on_multirun_end(cfg)
    assert exit_.value.code == 1
    assert capsys.readouterr().out.splitlines() == [
        "[harness] sweep done: 3 completed, 1 failed, 1 skipped (skipped = already finished in res)",
        "[harness] jobs ran on 2 Ray nodes: n1 (2 jobs), n2 (1 job)"]


# ------------------------------------------------------------------ settings a cluster refuses (fast)
def ray_launcher_cfg(init: dict) -> OmegaConf:
    return OmegaConf.create({"hydra": {"launcher": {
        "_target_": "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher", "ray": {"init": init, "remote": {}}}}})


@pytest.mark.parametrize("init, env, refused", [
    ({"address": "auto"}, None,  # the plugin would add its 75 MB object store; Ray refuses it for a cluster
     "hydra.launcher.ray.init.object_store_memory must be null when the sweep connects to a running Ray "
     "cluster (address 'auto': its nodes' `ray start` set their resources; hydra/launcher=ray_cluster does "
     "this), got 78643200 (hydra-ray-launcher's default for a local instance)"),
    ({"address": None, "num_cpus": 2}, "10.0.0.1:6379",  # ray.init reads RAY_ADDRESS when address is null
     "hydra.launcher.ray.init.num_cpus must be null when the sweep connects to a running Ray cluster "
     "(address '10.0.0.1:6379' from RAY_ADDRESS: its nodes' `ray start` set their resources; "
     "hydra/launcher=ray_cluster does this), got 2"),
    ({"address": "10.0.0.1:6379", "object_store_memory": None, "resources": {"gpu_a": 1}}, None,
     "hydra.launcher.ray.init.resources must be null when the sweep connects to a running Ray cluster "
     "(address '10.0.0.1:6379': its nodes' `ray start` set their resources; hydra/launcher=ray_cluster "
     "does this), got {'gpu_a': 1}"),
    ({"address": None, "num_cpus": 2, "include_dashboard": False}, None, None),  # a new local instance
    ({"address": "local", "num_cpus": 2}, "10.0.0.1:6379", None),  # "local": never RAY_ADDRESS
    ({"address": "auto", "object_store_memory": None}, "10.0.0.1:6379", None),  # what ray_cluster sets
])
def test_ray_settings_a_running_cluster_refuses_are_one_line(init, env, refused, monkeypatch, capsys, tmp_path):
    """The settings alone (whether a cluster answers there is tests/test_hostile_launch.py's)."""
    from harness.callbacks import refuse_ray_node_settings

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # no cluster a `ray start` on this machine recorded
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    if refused is None:
        refuse_ray_node_settings(ray_launcher_cfg(init))
        assert capsys.readouterr().out == ""
        return
    with pytest.raises(SystemExit) as exit_:
        refuse_ray_node_settings(ray_launcher_cfg(init))
    assert exit_.value.code == 2
    assert capsys.readouterr().out == f"invalid config: {refused}\n"


@NEEDS_RAY
def test_ray_cluster_launcher_config_passes_the_check(monkeypatch, capsys):
    """Its settings pass the node-settings check (whether a cluster answers at ``auto`` is
    tests/test_hostile_launch.py's)."""
    from harness.callbacks import refuse_ray_node_settings

    from .test_launchers import compose_with_hydra

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = compose_with_hydra(["hydra/launcher=ray_cluster"])
    assert OmegaConf.to_container(cfg.hydra.launcher.ray) == {
        "init": {"address": "auto", "object_store_memory": None}, "remote": {}}
    refuse_ray_node_settings(cfg)
    assert capsys.readouterr().out == ""
