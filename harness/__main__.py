"""``python -m harness [overrides]`` — see README.md and docs/running.md.

Ctrl-C (SIGINT) at any moment, imports included, ends the command with one line on stderr,
:data:`INTERRUPTED`, and exit code 130: nothing finished is lost and nothing half-written is
read back (atomic writes; the run's lock dies with the process), and the same command resumes."""
import re
import sys

from harness.interrupt import INTERRUPTED, exit_interrupted

try:
    import hydra

    from harness.app import main_entry
    from harness.config import expand_path, register_configs
    from harness.plugins import preload
    from harness.tune import objective, wants_objective

    preload(sys.argv[1:])  # a plugin's losses add their knobs to the schema: before it is stored
    register_configs()
except KeyboardInterrupt:
    exit_interrupted()

_RESULTS_DIR = re.compile(r"^(\+{0,2}results_dir=)(['\"]?)(~[^'\"]*)\2$")


def expand_results_dir(argv: list[str]) -> list[str]:
    """``results_dir=~/x`` (or Hydra-quoted ``results_dir='~/x'``) on the command line means
    ``$HOME/x`` (:func:`harness.config.expand_path`, the rule the run directories and the LM
    cache follow), for Hydra's job folder too (Hydra's grammar refuses an unquoted ``~``)."""
    out = []
    for arg in argv:
        m = _RESULTS_DIR.match(arg)
        if m:
            arg = m.group(1) + m.group(2) + ",".join(expand_path(p) for p in m.group(3).split(",")) + m.group(2)
        out.append(arg)
    return out


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg) -> float | None:
    """Train (or skip) the runs of ``cfg``. Under ``hydra/sweeper=optuna`` the job returns the
    value the sweeper maximises (:func:`harness.tune.objective`); otherwise nothing."""
    main_entry(cfg)
    if not wants_objective():
        return None
    value = objective(cfg)
    print(f"[harness] objective (final score, harness.tune.objective) = {value:.4g}")
    return value


def cli() -> None:
    """``python -m harness`` and the ``pg-harness`` console script (pyproject.toml)."""
    try:
        sys.argv[1:] = expand_results_dir(sys.argv[1:])
        main()
    except KeyboardInterrupt:
        exit_interrupted()


if __name__ == "__main__":
    cli()
