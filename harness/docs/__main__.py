"""``python -m harness.docs --write | --check``: the docs' tables from the registries (:mod:`.tables`)."""
import sys

from .tables import main

if __name__ == "__main__":
    sys.exit(main())
