"""``python -m analysis`` and the ``pg-analysis`` console script (pyproject.toml)."""
import sys

from harness.interrupt import exit_interrupted, exit_now, exit_without_teardown

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while importing: the one line main() prints for it, exit 130
    exit_interrupted()


def cli() -> None:
    code = main()
    if code == 130:  # interrupted (main printed the line): exit 130 for sure (harness.interrupt)
        exit_now(130)
    if isinstance(code, int):  # the interpreter's teardown was ~1 s of a report (harness.interrupt)
        exit_without_teardown(code)
    sys.exit(code)


if __name__ == "__main__":
    cli()
