"""Hydra callback: results_dir checked before Hydra writes its job folder there, and one line
at the end of a sweep with how many runs were skipped, done, failed (exit code 1 if any failed).
A job run in a worker process of the sweep (``hydra/launcher=joblib``) ends with the sweep's
process: killed, it leaves no worker training on (:func:`watch_parent`)."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from .config import connect_problem, error_line, expand_path, path_problem, results_path
from .io.files import read_json


def refuse_unusable_results_dir(config: DictConfig, job_dir: str | None = None) -> None:
    """Hydra creates its job folder under results_dir before the task starts: a results_dir
    that is a file, or under a file or a read-only place, would end there in a traceback; so
    would any component of the job folder's path Hydra cannot make (a name longer than the file
    system takes, a symlink loop, a dangling symlink, ``results_dir/.hydra`` a regular file).
    ``job_dir``: the key of the job folder (``hydra.run.dir`` or ``hydra.sweep.dir``), whose
    whole path is checked too (:func:`harness.config.path_problem`). One line (as
    :func:`harness.app.main_entry` words an invalid config) and exit code 2 instead."""
    try:
        path = results_path(config)
    except Exception as exc:  # an unresolvable interpolation (${oc.env:UNSET}): Hydra's traceback
        print(f"invalid config: {error_line(exc)}")
        raise SystemExit(2)
    problem = path_problem(path, writable=True)
    field = "results_dir"
    if not problem and job_dir is not None:
        try:
            raw = OmegaConf.select(config, job_dir, default=None)
        except Exception as exc:  # e.g. hydra.run.dir=${oc.env:UNSET}
            print(f"invalid config: {error_line(exc)}")
            raise SystemExit(2)
        folder = expand_path(raw) if raw is not None else None
        if folder:
            inside = os.path.abspath(folder).startswith(os.path.join(os.path.abspath(path), ""))
            problem = path_problem(path, writable=True, below=os.path.relpath(folder, path)) if inside \
                else path_problem(folder, writable=True)
            field = "results_dir" if inside else job_dir
            if inside and not problem:
                problem = linked_part(path, os.path.relpath(folder, path))
    if problem:
        print(f"invalid config: {field} must be a folder the harness can create and write ({problem}), "
              f"got {str(config[field] if field == 'results_dir' else OmegaConf.select(config, field))!r}")
        raise SystemExit(2)


def linked_part(root: str, rel: str) -> str | None:
    """Why Hydra's job folder ``root/rel`` would be written outside ``root``: an
    existing folder on the way (``results_dir/.hydra``, ...) is a symlink; else None. The run
    folders get the same rule (:meth:`harness.io.RunDir.blocker`)."""
    at = root
    for part in rel.split(os.sep):
        at = os.path.join(at, part)
        if os.path.islink(at):
            return f"{at} is a symlink (to {os.readlink(at)}): Hydra's job folder would be written outside {root}"
        if not os.path.isdir(at):
            return None
    return None


def refuse_bad_launcher(config: DictConfig) -> None:
    """Launcher settings the launcher would refuse with a traceback after the sweep started:
    ``hydra.launcher.n_jobs`` (joblib) must be a non-zero integer (-1: every core) or null;
    ``hydra.launcher.ray.init`` connecting to a running cluster names one that answers
    (:func:`refuse_unreachable_ray_cluster`) and takes no node resources
    (:func:`refuse_ray_node_settings`). One line and exit code 2 instead."""
    n_jobs = OmegaConf.select(config, "hydra.launcher.n_jobs", default=None)
    if n_jobs is not None and (isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs == 0):
        print("invalid config: hydra.launcher.n_jobs must be a non-zero integer (n parallel jobs; -1 every "
              f"core, -2 all but one, ...) or null, got {n_jobs!r}")
        raise SystemExit(2)
    if str(OmegaConf.select(config, "hydra.launcher._target_", default="")).endswith(".ray_launcher.RayLauncher"):
        refuse_unreachable_ray_cluster(config)  # first: with no cluster there, its settings are moot
        refuse_ray_node_settings(config)


#: What ``ray.init`` refuses when it connects to a running Ray cluster, whose nodes took their
#: resources from their own ``ray start`` (``ray._private.worker.init``, Ray 2.60).
RAY_NODE_SETTINGS = ("num_cpus", "num_gpus", "resources", "labels", "object_store_memory")
#: hydra-ray-launcher's ``object_store_memory`` for a ``ray.init`` that has none (bytes, 75 MB).
RAY_PLUGIN_OBJECT_STORE = 78643200
#: Seconds the sweep waits for a TCP connection to the Ray cluster before it refuses the address
#: (``ray.init`` itself waits 5 s per attempt and retries for minutes on an address nobody answers).
RAY_CONNECT_TIMEOUT_S = 5.0


def ray_init_settings(config: DictConfig) -> tuple[dict, str | None, str]:
    """``hydra.launcher.ray.init`` as a dict, the address ``ray.init`` connects to, and where that
    address came from, as ``ray.init`` reads it: ``address``; ``RAY_ADDRESS`` when that is null or
    ``auto``; with both unset, the cluster the last ``ray start`` on this machine recorded
    (:func:`recorded_ray_cluster`). The address is None (or ``local``) for a new local Ray
    instance; where it came from is "" when it is ``address`` itself."""
    init = OmegaConf.select(config, "hydra.launcher.ray.init", default=None)
    init = OmegaConf.to_container(init, resolve=True) if isinstance(init, DictConfig) else {}
    address, source = init.get("address"), ""
    if address in (None, "auto") and os.environ.get("RAY_ADDRESS"):
        address, source = os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    if address is None:
        address, source = recorded_ray_cluster()
    return init, None if address in (None, "local") else str(address), source


def recorded_ray_cluster() -> tuple[str | None, str]:
    """The address ``ray.init(address=None)`` connects to instead of starting a local instance:
    the one the last ``ray start`` on this machine wrote to ``ray_current_cluster`` in Ray's temp
    folder (``RAY_TMPDIR``, else /tmp/ray), and that file; (None, "") without one, or without Ray."""
    try:
        from ray._private.utils import get_ray_address_file, read_ray_address
    except ImportError:
        return None, ""
    address = read_ray_address()
    return (address, get_ray_address_file(None)) if address else (None, "")


def ray_address_text(address: str, source: str) -> str:
    """``'<address>'``, with ``from <source>`` when it is not the config's own value."""
    return f"{address!r} from {source}" if source else repr(address)


def refuse_ray_node_settings(config: DictConfig) -> None:
    """``hydra/launcher=ray`` that connects to a running cluster (``ray.init.address`` set, or
    null/``auto`` with ``RAY_ADDRESS`` in the environment or a cluster ``ray start`` recorded, as
    ``ray.init`` reads them: :func:`ray_init_settings`) with a setting only a new local instance
    takes: Ray would refuse it in a traceback once the sweep started. The plugin adds
    ``object_store_memory`` itself when the key is missing; ``hydra/launcher=ray_cluster`` sets it
    to null. One line and exit code 2 instead."""
    init, address, source = ray_init_settings(config)
    if address is None:  # a new local Ray instance: every setting applies
        return
    for key in RAY_NODE_SETTINGS:
        value = init.get(key, RAY_PLUGIN_OBJECT_STORE if key == "object_store_memory" else None)
        if value is not None:
            unset = " (hydra-ray-launcher's default for a local instance)" if key not in init else ""
            print(f"invalid config: hydra.launcher.ray.init.{key} must be null when the sweep connects to a "
                  f"running Ray cluster (address {ray_address_text(address, source)}: its nodes' `ray start` set "
                  f"their resources; hydra/launcher=ray_cluster does this), got {value!r}{unset}")
            raise SystemExit(2)


def ray_cluster_problem(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> str | None:
    """Why no Ray cluster answers at ``address`` (as ``ray.init(address=...)`` takes it), else
    None: ``auto`` finds no cluster, the address is not ``host:port``, the host does not resolve,
    or no TCP connection opens within ``timeout_s``. ``auto`` and a local host are turned into the
    ``host:port`` ``ray.init`` connects to by Ray's own function, when Ray is installed;
    ``ray://host:port`` is Ray Client's server, connected to as it is."""
    target = address.removeprefix("ray://")
    if target == address:
        try:
            from ray._private.services import canonicalize_bootstrap_address
        except ImportError:  # no Ray: the launcher cannot start either; the address is probed as it is
            canonicalize_bootstrap_address = None
        if canonicalize_bootstrap_address is not None:
            try:
                target = canonicalize_bootstrap_address(address) or target
            except (ConnectionError, ValueError) as exc:  # auto with no cluster on this node; a bad format
                return error_line(exc)
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return f"{target!r} is not host:port"
    return connect_problem(host.strip("[]"), int(port), timeout_s, target)


def refuse_unreachable_ray_cluster(config: DictConfig) -> None:
    """``hydra/launcher=ray`` pointed at a Ray cluster that does not answer (no TCP connection to
    its address within :data:`RAY_CONNECT_TIMEOUT_S`, an unresolvable host, ``auto`` with no
    cluster, a stopped cluster ``ray start`` recorded): ``ray.init`` would retry for minutes or
    end in a ConnectionError traceback after the sweep folder exists. One line and exit code 2
    instead, before any folder is made."""
    _, address, source = ray_init_settings(config)
    if address is None:  # a new local Ray instance: nothing to reach
        return
    problem = ray_cluster_problem(address)
    if problem is not None:
        print(f"invalid config: hydra.launcher.ray.init.address must be a running Ray cluster's address "
              f"(host:port of its head, ray://host:port, auto: the cluster this node's `ray start` joined; "
              f"null or local: a new local instance), got {ray_address_text(address, source)}: {problem}")
        raise SystemExit(2)


#: The sweep's process id, set by :meth:`SweepSummary.on_multirun_start` for the worker processes
#: the joblib launcher starts (they inherit the environment). Other launchers' jobs are left as
#: they are: in-process (basic), or started and kept by their own scheduler (submitit, ray).
SWEEP_PID_ENV = "HARNESS_SWEEP_PID"
#: The resource tracker of joblib's workers warns about the semaphores it cleans up after an
#: interrupted sweep (Ctrl-C); that is its job, not a fault: the warning is left out.
_TRACKER_WARNING = "ignore:resource_tracker:UserWarning"
_watching: list[int] = []


def watch_parent(parent: int, poll_s: float = 0.2) -> bool:
    """In a worker process whose parent is the sweep's process ``parent``: a daemon thread ends
    this process (exit code 1) within ``poll_s`` seconds of the parent's death (a SIGKILL
    leaves joblib's workers training for minutes otherwise). Nothing is lost: every file is
    written atomically and the run's lock (an ``flock``) dies with the process, so the rerun
    resumes it; a job that starts after the sweep died ends at once. Does nothing (False)
    anywhere else: in the sweep's own process, or in a process a worker started (its parent is
    the worker, the sweep lives); once per process."""
    if parent == os.getpid() or _watching:
        return False
    if os.getppid() != parent:
        try:
            os.kill(parent, 0)
        except ProcessLookupError:  # the sweep died before this job started: end with it
            os._exit(1)
        except OSError:
            pass
        return False  # started by a worker, not by the sweep: its own parent watches
    _watching.append(parent)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="harness-watch-parent", daemon=True).start()
    return True


def sweep_size(config: DictConfig) -> int | None:
    """The jobs of a sweep by Hydra's basic sweeper (whatever the launcher): its
    ``hydra.sweeper.params`` and the command line's overrides (which win), expanded as the sweeper
    expands them (``BasicSweeper.split_arguments``). None for another sweeper (a count it decides
    as it goes) or a sweep it cannot expand (Hydra refuses it later, with its own message)."""
    if not str(OmegaConf.select(config, "hydra.sweeper._target_", default="")).endswith(".BasicSweeper"):
        return None
    try:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.override_parser.overrides_parser import OverridesParser

        params = [f"{k}={v}" for k, v in (OmegaConf.select(config, "hydra.sweeper.params") or {}).items()]
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        overrides = parser.parse_overrides(params + list(config.hydra.overrides.task))
        return sum(len(batch) for batch in BasicSweeper.split_arguments(overrides, None))
    except Exception:
        return None


#: ``<jobs>,<start time>`` of the sweep in progress: set at its start (:func:`sweep_size`,
#: ``time.time()``), read by its jobs' ends in whatever process the launcher runs them
SWEEP_PROGRESS_ENV = "HARNESS_SWEEP_PROGRESS"


def sweep_progress(sweep_dir: str, now: float | None = None) -> str | None:
    """One line after a job of a sweep (:data:`SWEEP_PROGRESS_ENV` set): jobs done (each done
    job leaves ``outcome.json`` in its folder under ``sweep_dir``, from :func:`harness.app.write_outcome`,
    whichever process ran it), the time so far, and the time left at the mean pace so far (parallel
    jobs included; tqdm's interval format). None outside such a sweep."""
    try:
        total_s, start_s = os.environ[SWEEP_PROGRESS_ENV].split(",")
        total, start = int(total_s), float(start_s)
    except (KeyError, ValueError):
        return None
    from tqdm import tqdm

    done = sum(1 for f in Path(sweep_dir).glob("*/outcome.json") if f.stat().st_mtime >= start)
    spent = max((time.time() if now is None else now) - start, 0.0)
    line = f"[harness] sweep: {done} of {total} jobs done in {tqdm.format_interval(spent)}"
    if 0 < done < total:
        line += f", about {tqdm.format_interval(spent / done * (total - done))} left"
    return line


class SweepSummary(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        refuse_unusable_results_dir(config, "hydra.run.dir")

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        line = sweep_progress(str(OmegaConf.select(config, "hydra.sweep.dir", default="")))
        if line:
            print(line)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        refuse_bad_launcher(config)
        refuse_unusable_results_dir(config, "hydra.sweep.dir")
        total = sweep_size(config)
        if total and total > 1:  # its jobs' processes inherit it (the launchers' workers start after this)
            os.environ[SWEEP_PROGRESS_ENV] = f"{total},{time.time()}"
        if "joblib" in str(OmegaConf.select(config, "hydra.launcher._target_", default="")).lower():
            os.environ[SWEEP_PID_ENV] = str(os.getpid())  # the workers it starts watch it (on_job_start)
            previous = os.environ.get("PYTHONWARNINGS", "")
            if _TRACKER_WARNING not in previous:
                os.environ["PYTHONWARNINGS"] = ",".join(w for w in (previous, _TRACKER_WARNING) if w)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        parent = os.environ.get(SWEEP_PID_ENV, "")
        if parent.isdigit():
            watch_parent(int(parent))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        os.environ.pop(SWEEP_PROGRESS_ENV, None)
        totals: dict[str, int] = {}
        places: dict[str, int] = {}
        for f in Path(config.hydra.sweep.dir).glob("*/outcome.json"):
            try:
                outcome = read_json(f)  # harness.io.files: a regular file, bounded
                ran_on = outcome.pop("ran_on", None)  # harness.app.where_job_ran
                counts = {k: int(v) for k, v in outcome.items()}
            except (OSError, ValueError, TypeError, AttributeError):
                continue
            for k, v in counts.items():
                totals[k] = totals.get(k, 0) + v
            place = ran_on.get("ray_node_id") if isinstance(ran_on, dict) else None
            if place:
                places[str(place)] = places.get(str(place), 0) + 1
        if totals:
            listed = ", ".join(f"{v} {k}" for k, v in sorted(totals.items()) if v)
            print(f"[harness] sweep done: {listed} (skipped = already finished in {config.results_dir})")
        if places:  # jobs run by the Ray launcher: on which nodes (each job's outcome.json has it)
            listed = ", ".join(f"{node} ({n} job{'s' if n > 1 else ''})" for node, n in sorted(places.items()))
            print(f"[harness] jobs ran on {len(places)} Ray node{'s' if len(places) > 1 else ''}: {listed}")
        if totals.get("failed"):  # the other runs were done; the sweep as a whole did not succeed
            raise SystemExit(1)
