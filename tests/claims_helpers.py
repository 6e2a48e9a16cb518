"""Shared set-up of the claims report's tests."""
from __future__ import annotations

from pathlib import Path


def report_without_runs(root: Path, monkeypatch) -> None:
    """A claims report built in ``root`` with no experiment composed (every claim not run), and one
    figure, ``claims_figures/c3.png``, for the commands that copy the report's figures."""
    from analysis import claims as C
    from analysis.claims.evidence import NotRun

    def not_composed(name, *args, **kwargs):
        raise NotRun(f"{name}: not composed in this test")

    monkeypatch.setattr(C, "compose_points", not_composed)
    C.build_claims_report(root, quick=False, progress=lambda s: None)
    (root / "claims_figures").mkdir(exist_ok=True)
    (root / "claims_figures" / "c3.png").write_bytes(b"png")
