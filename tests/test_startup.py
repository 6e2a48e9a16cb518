"""What importing the harness does to a fresh process (``python -m harness`` starts this way)."""
import os
import subprocess
import sys

import pytest


def _fresh(code: str, **env_changes) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.update(env_changes)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_importing_harness_makes_openmp_threads_wait_passively_unless_the_user_chose():
    assert _fresh("import harness, os; print(os.environ['OMP_WAIT_POLICY'])") == "PASSIVE"
    assert _fresh("import harness, os; print(os.environ['OMP_WAIT_POLICY'])", OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"


def test_restoring_unchanged_determinism_does_not_import_torch_dynamo():
    """``torch.use_deterministic_algorithms`` imports ``torch._dynamo`` (over a second of a
    process) even when it changes nothing; a run with ``deterministic=false`` restores the
    settings it never changed, so it must not be called then. With a change it still is."""
    code = ("import sys, torch\n"
            "from harness.app import restore_determinism, set_determinism\n"
            "restore_determinism(set_determinism(False))\n"
            "print('torch._dynamo' in sys.modules, torch.are_deterministic_algorithms_enabled())\n"
            "restore_determinism(set_determinism(True))\n"
            "print(torch.are_deterministic_algorithms_enabled())\n")
    assert _fresh(code).splitlines() == ["False False", "False"]


@pytest.mark.parametrize("task", [["task=cartpole", "estimator=ppo_gae", "task.num_envs=2", "task.rollout_steps=8"],
                                  ["task=toy", "estimator=ppo_gae"]], ids=["control", "toy"])
def test_a_control_or_toy_run_trains_without_importing_torch_dynamo(task, tmp_path):
    """Making a ``torch.optim.Adam`` imports ``torch._dynamo`` (0.85-0.92 s of a process, beside a
    ~9 s CartPole run) for ``add_param_group``'s dynamo wrapper, and so does ``Adam.step``; the
    harness's fused Adam is made without it and steps without ``Adam.step``
    (:func:`harness.train.update.adam_without_dynamo`), and the CLI does not import it at start-up
    for a control run (:func:`harness.app.imports_dynamo`). A whole CLI run, in a fresh process,
    must not import it, and leaves the wrapper as torch made it (the next plain Adam imports it).
    The toy task's unfused Adam neither (stepped through ``torch.optim.adam.adam``, with a critic)."""
    args = [*task, "budget.iterations=3",
            "progress=false", f"results_dir={tmp_path / 'r'}", f"hydra.run.dir={tmp_path / 'h'}"]
    code = ("import sys, torch\n"
            "from harness.__main__ import cli\n"
            "fn = torch.optim.Optimizer.add_param_group.__wrapped__\n"
            f"sys.argv = ['harness', *{args!r}]\n"
            "cli()\n"
            "print('torch._dynamo' in sys.modules, hasattr(fn, '__dynamo_disable'))\n"
            "torch.optim.Adam([torch.zeros(1, requires_grad=True)])\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = _fresh(code)
    assert out.splitlines()[-2:] == ["False False", "True"], out[-2000:]
    assert list((tmp_path / "r").rglob("metrics.parquet"))
