"""Compose configs the way ``python -m harness`` does, with tiny budgets: :func:`harness.testing.compose`
(the registry's contract tests use the same), so ``--pg-searchpath`` reaches these tests too."""
from pathlib import Path

from harness.testing import TINY
from harness.testing import compose as make_cfg

CONF = str(Path(__file__).resolve().parents[1] / "harness" / "conf")

__all__ = ["CONF", "TINY", "make_cfg"]
