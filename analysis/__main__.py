"""``python -m analysis`` and the ``pg-analysis`` console script (pyproject.toml)."""
import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while importing: the one line main() prints for it, exit 130
    print("interrupted; rerun the same command to resume", file=sys.stderr)
    sys.exit(130)


def cli() -> None:
    sys.exit(main())


if __name__ == "__main__":
    cli()
