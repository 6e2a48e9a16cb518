"""What importing the harness does to a fresh process (``python -m harness`` starts this way)."""
import os
import subprocess
import sys


def _fresh(code: str, **env_changes) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.update(env_changes)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_importing_harness_makes_openmp_threads_wait_passively_unless_the_user_chose():
    assert _fresh("import harness, os; print(os.environ['OMP_WAIT_POLICY'])") == "PASSIVE"
    assert _fresh("import harness, os; print(os.environ['OMP_WAIT_POLICY'])", OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"


def test_a_control_run_does_not_import_torch_dynamo(tmp_path):
    """``torch._dynamo`` (1.3 s of a process; ``torch.optim.Optimizer`` and
    ``torch.use_deterministic_algorithms`` import it on first use) serves nothing a control run does."""
    code = (
        "import sys; sys.path.insert(0, {root!r})\n"
        "import harness\n"
        "from tests.control_helpers import TINY, make_cfg\n"
        "from harness.app import run\n"
        "cfg = make_cfg(['task=cartpole', 'estimator=ppo_gae', 'population=2', *TINY, 'results_dir={tmp}'])\n"
        "assert run(cfg)['completed'] == 2, run\n"
        "print(sorted(m for m in ('torch._dynamo', 'torch._inductor', 'torch.optim') if m in sys.modules))\n"
    ).format(root=str(__import__("pathlib").Path(__file__).resolve().parents[1]), tmp=str(tmp_path))
    # torch.optim is imported by torch itself; what matters is that its Optimizer never runs
    assert _fresh(code) == "['torch.optim']"
