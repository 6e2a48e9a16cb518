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
