"""``python -m harness [overrides]`` — see README.md and docs/running.md.

Ctrl-C (SIGINT) at any moment, imports included, ends the command with one line on stderr,
:data:`INTERRUPTED`, and exit code 130: nothing finished is lost and nothing half-written is
read back (atomic writes; the run's lock dies with the process), and the same command resumes.

Python's cyclic garbage collector is off while the command starts (imports, Hydra, validation)
and comes back on, with everything start-up made frozen, when a run begins: :func:`end_startup`.
glibc's allocator keeps big blocks and free heap for reuse (:func:`harness.allocator.tune_allocator`).
A command that ends normally ends its process without the interpreter's teardown (:func:`command`)."""
import gc
import re
import sys

gc.disable()  # until end_startup

from harness.allocator import tune_allocator
from harness.interrupt import INTERRUPTED, exit_interrupted, exit_without_teardown

try:
    import hydra

    from harness.app import imports_dynamo, main_entry
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


def end_startup(import_dynamo: bool = True) -> None:
    """A valid run is about to train: import ``torch._dynamo`` if the run will
    (``import_dynamo``: :func:`harness.app.imports_dynamo`; a ``torch.optim`` optimizer imports
    it when made), freeze every object start-up made (:func:`gc.freeze`: modules, classes,
    Hydra's config, all long-lived; a cycle start-up left unreachable is kept, not freed) and turn
    the cyclic collector back on. Once per process: a sweep's later jobs find it on.

    Why: with the collector on from the first import, start-up's ~350,000 objects were scanned by
    six full collections while they were made and by one more at exit (0.50 s and 0.17 s of a 12 s
    zoo CartPole run, timed with ``gc.callbacks``); frozen, no later collection scans them, and a
    population's forked workers do not write to their pages. Nothing a run computes depends on
    when unreachable cycles are freed (``tests/test_cli_startup.py::test_the_cli_run_is_the_in_process_run``)."""
    if gc.isenabled():
        return
    if import_dynamo:  # with the collector off: imported later, with it on, 0.25-0.3 s more
        import torch._dynamo  # noqa: F401
    gc.freeze()
    gc.enable()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg) -> float | None:
    """Train (or skip) the runs of ``cfg``. Under ``hydra/sweeper=optuna`` the job returns the
    value the sweeper maximises (:func:`harness.tune.objective`); otherwise nothing."""
    main_entry(cfg, on_start=lambda: end_startup(imports_dynamo(cfg)))
    if not wants_objective():
        return None
    value = objective(cfg)
    print(f"[harness] objective (final score, harness.tune.objective) = {value:.4g}")
    return value


def cli() -> None:
    """The command in this process: returns when it is done (:func:`command` then ends the process)."""
    try:
        tune_allocator()
        sys.argv[1:] = expand_results_dir(sys.argv[1:])
        main()
    except KeyboardInterrupt:
        exit_interrupted()


def command() -> None:
    """``python -m harness`` and the ``pg-harness`` console script (pyproject.toml): :func:`cli`,
    then, when it returns, :func:`harness.interrupt.exit_without_teardown`."""
    cli()
    exit_without_teardown()


if __name__ == "__main__":
    command()
