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
