"""A user's package extends the harness without an edit to it (harness.plugins, harness.testing;
docs/extending.md): examples/plugin/ (``pgh_example``: estimator ``median_baseline``, policy loss
``clamped_pg``, env ``Corridor-v0`` with ``task=corridor``) imported by the ``plugins`` key or by an
installed entry point, its YAML from ``hydra.searchpath``. Every run here is a separate process: a
plugin's registrations last for the process, and this one's registries must stay the harness's own.
(CI also installs the built wheel and the example package in a fresh venv: .ci/wheel.)"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "plugin"
SEARCHPATH = "hydra.searchpath=[pkg://pgh_example.conf]"
TINY = ["budget.iterations=2", "task.num_envs=2", "task.rollout_steps=8", "task.episodes_per_iter=4",
        "group_size=2", "eval_every=0", "progress=false", "task.hidden=[8]", "threads=1"]


def _python(args: list[str], cwd: Path, extra_path: list[Path] = (), timeout: int = 300) -> subprocess.CompletedProcess:
    path = [str(p) for p in extra_path] + [str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(x for x in path if x), "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, *args], check=False, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _frames(results: Path) -> dict[tuple[str, str, str], "object"]:
    out = {}
    for summary in results.rglob("summary.json"):
        df = pq.read_table(summary.parent / "metrics.parquet").to_pandas()
        out[(df["task"].iloc[0], df["estimator"].iloc[0], df["update"].iloc[0])] = (json.loads(summary.read_text()), df)
    return out


def test_a_plugin_named_by_the_plugins_key_trains_its_estimator_loss_and_env_in_a_sweep(tmp_path):
    r = _python(["-m", "harness", "-m", SEARCHPATH, "plugins=[pgh_example.estimators]", "task=corridor",
                 "estimator=median_baseline,rloo", "policy_loss=clamped_pg", *TINY], tmp_path, [EXAMPLE])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    runs = _frames(tmp_path / "results")
    assert set(runs) == {("corridor", "median_baseline", "clamped_pg"), ("corridor", "rloo", "clamped_pg")}
    for summary, df in runs.values():
        assert summary["status"] == "completed" and df["iteration"].tolist() == [1, 2]
    # the run's config keeps the key, so the run's own config.yaml reruns it
    (cfg_file,) = (tmp_path / "results").rglob("*median_baseline*/**/config.yaml") or [None]
    assert cfg_file is None or "pgh_example.estimators" in cfg_file.read_text()


def _installed_example() -> bool:
    """Whether this environment already publishes pgh_example's entry point (``pip install
    ./examples/plugin``, as docs/extending.md shows): then no run here can be without it."""
    from importlib.metadata import entry_points
    return any(ep.name == "pgh_example" for ep in entry_points(group="pg_harness.plugins"))


def test_an_installed_entry_point_is_imported_without_the_key(tmp_path):
    """A package's ``pg_harness.plugins`` entry point (a dist-info folder on the path, as pip
    writes it) is enough: no ``plugins=`` on the command line. The example's sources are copied
    without build leftovers: the egg-info folder a ``pip install ./examples/plugin`` leaves beside
    them publishes the entry point too."""
    source = tmp_path / "example"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__"))
    dist = tmp_path / "site" / "pgh_example-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pgh-example\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[pg_harness.plugins]\npgh_example = pgh_example.estimators\n")
    r = _python(["-m", "harness", SEARCHPATH, "task=corridor", "estimator=median_baseline", *TINY], tmp_path,
                [source, tmp_path / "site"])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert set(_frames(tmp_path / "results")) == {("corridor", "median_baseline", "pg")}
    if _installed_example():  # the environment's own install publishes it: there is no run without it
        return
    (tmp_path / "other").mkdir()
    r = _python(["-m", "harness", SEARCHPATH, "task=corridor", "estimator=median_baseline", *TINY], tmp_path / "other",
                [source])  # without the entry point (python -m puts the working folder on the path): unknown
    assert r.returncode == 2 and "estimator must be one of" in r.stdout


@pytest.mark.parametrize("value, shown", [
    ("[no_such_module_xyz]", "plugins must be importable module names"),
    ("[pgh_broken]", "importing it raised RuntimeError: broken on purpose"),
    ("[pgh_twice]", "importing it raised ValueError: estimator 'rloo' is already registered"),
    # a name is a folder of the run's path: '../..' would write outside results_dir
    ("[pgh_escape]", "importing it raised ValueError: estimator name '../../escaped': starts with '.'"),
    ("[pgh_loss_escape]", "importing it raised ValueError: policy loss name 'a/b': contains '/'"),
    # a plugin's sys.exit (0 or its own code) is refused, not a silent no-op of the command
    ("[pgh_exit]", "importing it raised SystemExit: 0"),
])
def test_a_plugin_that_cannot_be_imported_is_one_line_exit_2_before_any_run(value, shown, tmp_path):
    (tmp_path / "pgh_broken.py").write_text("raise RuntimeError('broken on purpose')\n")
    (tmp_path / "pgh_twice.py").write_text(
        "from harness.estimators import EstimatorSpec, get_estimator, register\n"
        "register(EstimatorSpec('rloo', get_estimator('rloo').fn, needs_critic=False))\n")
    (tmp_path / "pgh_escape.py").write_text(
        "from harness.estimators import EstimatorSpec, get_estimator, register\n"
        "register(EstimatorSpec('../../escaped', get_estimator('rloo').fn, needs_critic=False))\n")
    (tmp_path / "pgh_loss_escape.py").write_text(
        "from harness.losses import get_policy_loss, register_policy_loss\n"
        "register_policy_loss('a/b', get_policy_loss('pg').fn)\n")
    (tmp_path / "pgh_exit.py").write_text("import sys\nsys.exit(0)\n")
    r = _python(["-m", "harness", f"plugins={value}", f"results_dir={tmp_path}/res", *TINY], tmp_path, [tmp_path])
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(lines) == 1 and lines[0].startswith("invalid config: plugins must be") and shown in lines[0], lines
    assert "Traceback" not in r.stderr
    assert [p.name for p in (tmp_path / "res").iterdir()] == [".hydra"]  # Hydra's job folder only: no run


def test_the_registry_tests_run_on_the_plugin_and_catch_a_missing_yaml(tmp_path):
    """``python -m pytest --pyargs harness.testing --pg-plugins ... --pg-searchpath ...``: the
    contract tests include the plugin's estimator, loss and task; without its config folder the
    estimator has no YAML and the contract test that pairs names and files fails."""
    k = "median_baseline or clamped_pg or corridor or one_yaml"
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", "harness.testing", "-k", k,
            "--pg-plugins", "pgh_example.estimators"]
    r = _python([*args, "--pg-searchpath", "pkg://pgh_example.conf"], tmp_path, [EXAMPLE], timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    tail = r.stdout.strip().splitlines()[-1]
    # the pairing test + median_baseline's YAML and training (2) + clamped_pg's signature and settings, under
    # 5 aggregations and on 2 tasks (8) + corridor with reinforce and a2c (2)
    assert tail.startswith("13 passed"), tail
    r = _python(args, tmp_path, [EXAMPLE], timeout=600)
    assert r.returncode == 1 and "test_every_registered_estimator_has_one_yaml_and_every_yaml_is_registered" in r.stdout


# A plugin whose functions break the contract every call of an estimator or policy loss is checked
# against (harness.estimators.registry.EstimatorSpec.__call__, harness.losses.PolicyLoss.__call__), each
# selected by its YAML from the plugin's own config folder. est_late and est_late_raise keep it on the
# trial call's 3 steps and break it only on a real batch (more steps).
CONTRACT_PLUGIN = '''
import torch

from harness.estimators import register_estimator
from harness.losses import pg_loss, register_policy_loss


@register_estimator("est_list")
def est_list(rewards):
    return rewards.tolist()


@register_estimator("est_shape")
def est_shape(rewards):
    return rewards[0]


@register_estimator("est_numpy")
def est_numpy(rewards):
    return rewards.numpy()


@register_estimator("est_int")
def est_int(scores):
    return scores.argsort(dim=1)


@register_estimator("est_double")
def est_double(rewards):
    return rewards.double()


@register_estimator("est_meta")
def est_meta(rewards):
    return torch.empty_like(rewards, device="meta")


@register_estimator("est_no_targets")
def est_no_targets(rewards, values):
    return rewards - values


@register_estimator("est_raises")
def est_raises(rewards):
    raise RuntimeError("broken estimator")


@register_estimator("est_late")
def est_late(rewards):
    return rewards if rewards.shape[0] == 3 else rewards[1:]


@register_estimator("est_late_raise")
def est_late_raise(rewards):
    if rewards.shape[0] != 3:
        raise RuntimeError("broken on a real batch")
    return rewards


@register_policy_loss("loss_2d")
def loss_2d(x, s):
    return -(x.logp * x.advantages * x.mask).sum(dim=-1), {}


@register_policy_loss("loss_list")
def loss_list(x, s):
    loss, metrics = pg_loss(x, s)
    return loss.tolist(), metrics


@register_policy_loss("loss_float")
def loss_float(x, s):
    return 0.5, {}


@register_policy_loss("loss_int")
def loss_int(x, s):
    return x.mask.sum(dim=(-2, -1)).long(), {}


@register_policy_loss("loss_detached")
def loss_detached(x, s):
    loss, metrics = pg_loss(x, s)
    return loss.detach(), metrics


@register_policy_loss("loss_raises")
def loss_raises(x, s):
    raise ValueError("broken loss")
'''
CONTRACT_ESTIMATORS = ["est_list", "est_shape", "est_numpy", "est_int", "est_double", "est_meta", "est_no_targets",
                       "est_raises", "est_late", "est_late_raise"]
CONTRACT_LOSSES = ["loss_2d", "loss_list", "loss_float", "loss_int", "loss_detached", "loss_raises"]
TRIAL_ADV = "expected [T, B] = (3, 4) tensors, torch.float32 on cpu (like rewards)"  # EstimatorSpec.trial's batch
# PolicyLoss.trial's inputs: 2 members of [T, B] = [3, 4]: a loss per member
TRIAL_LOSS = ("expected (loss, metrics): loss a floating tensor of shape (2,) on cpu (advantages (2, 3, 4) reduced "
              "over [T, B]) with a gradient, metrics a dict of tensors of that shape")
TRIAL = "; found by a trial call on synthetic inputs, before the run"


def _contract_plugin(root: Path) -> str:
    """The plugin module and its config folder under ``root``; returns the search path override."""
    (root / "pgh_contract.py").write_text(CONTRACT_PLUGIN)
    for name in CONTRACT_ESTIMATORS:
        (root / "conf" / "estimator").mkdir(parents=True, exist_ok=True)
        (root / "conf" / "estimator" / f"{name}.yaml").write_text(
            f"# @package _global_\nestimator: {name}\nupdate: pg\ngroup_size: 2\n")
    for name in CONTRACT_LOSSES:
        (root / "conf" / "policy_loss").mkdir(parents=True, exist_ok=True)
        (root / "conf" / "policy_loss" / f"{name}.yaml").write_text(f"# @package _global_\nupdate: {name}\n")
    return f"hydra.searchpath=[file://{root / 'conf'}]"


@pytest.mark.parametrize("choice, shown", [
    ("estimator=est_list", f"returned advantages: an object of type list; {TRIAL_ADV}"),
    ("estimator=est_shape", f"returned advantages: a tensor of shape (4,), torch.float32 on cpu; {TRIAL_ADV}"),
    ("estimator=est_numpy", f"returned advantages: an object of type ndarray; {TRIAL_ADV}"),
    # a group estimator's rows, before they are spread over the steps: 2 groups of group_size=2 (its YAML)
    ("estimator=est_int", "returned advantages: a tensor of shape (2, 2), torch.int64 on cpu; expected "
                          "[n_groups, group_size] = (2, 2) tensors, torch.float32 on cpu (like rewards)"),
    ("estimator=est_double", f"returned advantages: a tensor of shape (3, 4), torch.float64 on cpu; {TRIAL_ADV}"),
    ("estimator=est_meta", f"returned advantages: a tensor of shape (3, 4), torch.float32 on meta; {TRIAL_ADV}"),
    ("estimator=est_no_targets", f"returned critic targets: None; {TRIAL_ADV} (it reads a critic)"),
    ("estimator=est_raises", "raised RuntimeError: broken estimator"),
    ("policy_loss=loss_2d", f"returned loss: a tensor of shape (2, 3), torch.float32 on cpu; {TRIAL_LOSS}"),
    ("policy_loss=loss_list", f"returned loss: an object of type list; {TRIAL_LOSS}"),
    ("policy_loss=loss_float", f"returned loss: an object of type float; {TRIAL_LOSS}"),
    ("policy_loss=loss_int", "returned loss: a tensor of shape (2,), torch.int64 on cpu without a gradient; "
                             f"{TRIAL_LOSS}"),
    ("policy_loss=loss_detached", "returned loss: a tensor of shape (2,), torch.float32 on cpu without a gradient; "
                                  f"{TRIAL_LOSS}"),
    ("policy_loss=loss_raises", "raised ValueError: broken loss"),
])
def test_a_plugin_function_that_breaks_its_contract_is_one_line_exit_2_before_any_run(choice, shown, tmp_path):
    """The run's estimator and loss are called once on synthetic inputs at validation: what they return
    is checked against the contract, and a break (or a raise) is one line naming the function, its
    module and what was expected, before any run folder exists."""
    searchpath = _contract_plugin(tmp_path)
    r = _python(["-m", "harness", "plugins=[pgh_contract]", searchpath, "task=cartpole", choice,
                 f"results_dir={tmp_path}/res", *TINY], tmp_path, [tmp_path])
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 2, r.stdout + r.stderr
    group, name = choice.split("=")
    kind = "estimator" if group == "estimator" else "policy loss"
    assert lines == [f"invalid config: {kind} '{name}' (module pgh_contract) {shown}{TRIAL}"], lines
    assert "Traceback" not in r.stderr
    assert [p.name for p in (tmp_path / "res").iterdir()] == [".hydra"]  # Hydra's job folder only: no run


@pytest.mark.parametrize("estimator, reason", [
    # task.rollout_steps=8 steps of task.num_envs=2 envs: rewards [8, 2]; est_late drops the first step
    ("est_late", "ContractError: estimator 'est_late' (module pgh_contract) returned advantages: a tensor of shape "
                 "(7, 2), torch.float32 on cpu; expected [T, B] = (8, 2) tensors, torch.float32 on cpu (like rewards)"),
    ("est_late_raise", "ContractError: estimator 'est_late_raise' (module pgh_contract) raised RuntimeError: "
                       "broken on a real batch"),
])
def test_a_break_only_a_real_batch_shows_fails_the_run_with_the_line_naming_the_plugin(estimator, reason, tmp_path):
    """The same check on every call: a function that keeps the contract on the trial call and breaks it
    in the run fails that run (exit 1), its reason the line naming the function; the traceback is
    left out of the log for a broken contract (it would show only the check), kept for a raise (it
    shows the plugin's own frame)."""
    searchpath = _contract_plugin(tmp_path)
    r = _python(["-m", "harness", "plugins=[pgh_contract]", searchpath, "task=cartpole", f"estimator={estimator}",
                 f"results_dir={tmp_path}/res", *TINY], tmp_path, [tmp_path])
    assert r.returncode == 1, r.stdout + r.stderr
    (summary,) = (tmp_path / "res").rglob("summary.json")
    recorded = json.loads(summary.read_text())
    assert recorded["status"] == "failed" and recorded["reason"] == reason
    out = r.stdout + r.stderr
    assert f"run failed: {reason}" in out and "1 failed" in r.stdout
    assert ("Traceback" in out) == ("raised" in reason), out
    assert ('pgh_contract.py", line' in out) == ("raised" in reason), out
