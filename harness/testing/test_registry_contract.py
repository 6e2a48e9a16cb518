"""What every registered estimator, policy loss and (plugin) task must satisfy: enumerated from
the registries, so a user's additions (``--pg-plugins``, :mod:`harness.testing`) are held to the
same contract as the harness's own.

* Estimators: one YAML per registered name on Hydra's search path (and no YAML without a
  registration); composing ``estimator=<name>`` gives that name and a registered policy loss and
  passes validation; two iterations through the one training loop on CartPole give two rows of
  finite losses, with a value loss exactly when the estimator needs a critic.
* Policy losses: a finite scalar with a finite gradient under every aggregation mode, on ratios
  far from 1 and with padding; training through the one loop on a control and the toy task.
* Tasks from a plugin's config folder: each trains two iterations with ``reinforce`` and ``a2c``.
"""
from __future__ import annotations

import json
import math

import pyarrow.parquet as pq
import pytest
import torch

from harness.estimators import estimator_names, get_estimator
from harness.losses import AGG_MODES, POLICY_LOSSES, PolicyInputs

from . import SEARCHPATH, TINY, compose, group_options


def _run_dir(tmp_path):
    (run_dir,) = [p.parent for p in tmp_path.rglob("summary.json")]
    return run_dir


def _plugin_tasks() -> list[str]:
    return sorted(name for name, entry in group_options("task").items() if entry != "pkg://harness.conf")


# ------------------------------------------------------------------------------- estimators
def test_every_registered_estimator_has_one_yaml_and_every_yaml_is_registered():
    assert set(estimator_names()) == set(group_options("estimator")), (
        f"registered without a YAML: {sorted(set(estimator_names()) - set(group_options('estimator')))}; "
        f"a YAML without a registration: {sorted(set(group_options('estimator')) - set(estimator_names()))} "
        f"(search path: harness.conf + {SEARCHPATH})")


@pytest.mark.parametrize("name", estimator_names())
def test_estimator_yaml_composes_to_its_name_and_a_registered_policy_loss(name):
    from harness.validation import validate

    cfg = compose([f"estimator={name}"])
    assert cfg.estimator == name
    assert cfg["update"] in POLICY_LOSSES  # (cfg.update is DictConfig.update)
    validate(cfg)


@pytest.mark.parametrize("name", estimator_names())
def test_estimator_trains_two_iterations_through_the_one_loop(name, tmp_path):
    from harness.app import run

    counts = run(compose(["task=cartpole", f"estimator={name}", f"results_dir={tmp_path}", *TINY]))
    assert counts == {"skipped": 0, "completed": 1}
    run_dir = _run_dir(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["iterations"] == 2
    df = pq.read_table(run_dir / "metrics.parquet").to_pandas()
    assert df["iteration"].tolist() == [1, 2]
    assert (df["estimator"] == name).all()
    assert df["env_steps"].is_monotonic_increasing and df["env_steps"].iloc[0] > 0
    assert all(math.isfinite(v) for v in df["policy_loss"])
    assert df["value_loss"].notna().all() == get_estimator(name).needs_critic


# ---------------------------------------------------------------------------- policy losses
@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_policy_loss_takes_its_inputs_and_its_settings(name):
    """``fn(x: PolicyInputs, s: Settings)``: at most three parameters, the rest of what it reads is
    its settings dataclass, each field with a default (a config key with that default)."""
    import dataclasses
    import inspect

    spec = POLICY_LOSSES[name]
    assert len(inspect.signature(spec.fn).parameters) <= 3, inspect.signature(spec.fn)
    assert dataclasses.is_dataclass(spec.settings)
    spec.settings()  # every knob has a default that passes its own checks


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_policy_loss_is_a_finite_scalar_with_a_finite_gradient(name, agg):
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3
    logp = (old + torch.randn(4, 6, generator=g, dtype=torch.float64)).requires_grad_(True)  # ratios e^-2..e^2
    adv = torch.randn(4, 1, generator=g, dtype=torch.float64).expand(4, 6).clone()
    mask = torch.ones(4, 6, dtype=torch.float64)
    mask[0, 4:] = 0  # padding
    mask[2, 1:] = 0
    loss, metrics = POLICY_LOSSES[name](PolicyInputs(logp, old, adv, mask, agg=agg, norm_len=6))  # default settings
    assert loss.dim() == 0 and torch.isfinite(loss)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(grad).all()
    assert (grad[mask == 0] == 0).all()  # padding never moves the policy
    assert isinstance(metrics, dict)


@pytest.mark.parametrize("task", ["cartpole", "toy"])
@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_policy_loss_trains_through_the_one_loop(name, task, tmp_path):
    """Accepted by validation, trains on the control and toy families' paths and is named in
    every metric row (the LM family: its own tests' estimators)."""
    from harness.app import run

    args = ["task=cartpole", *TINY] if task == "cartpole" else ["task=toy", "budget.iterations=2"]
    counts = run(compose(args + ["estimator=grpo", f"update={name}", f"results_dir={tmp_path}"]))
    assert counts == {"skipped": 0, "completed": 1}
    df = pq.read_table(_run_dir(tmp_path) / "metrics.parquet").to_pandas()
    assert (df["update"] == name).all() and df["policy_loss"].notna().all()


# ------------------------------------------------------------------------------ plugin tasks
@pytest.mark.parametrize("estimator", ["reinforce", "a2c"])
@pytest.mark.parametrize("task", _plugin_tasks())
def test_plugin_task_trains_two_iterations(task, estimator, tmp_path):
    from harness.app import run

    counts = run(compose([f"task={task}", f"estimator={estimator}", f"results_dir={tmp_path}", *TINY]))
    assert counts == {"skipped": 0, "completed": 1}
    df = pq.read_table(_run_dir(tmp_path) / "metrics.parquet").to_pandas()
    assert df["iteration"].tolist() == [1, 2] and (df["task"] == task).all()
