import os

os.environ.setdefault("MPLBACKEND", "Agg")

# exact claims: @pytest.mark.claim("C7") (harness/experiments/pytest_claims.py)
from harness.experiments.pytest_claims import pytest_collection_modifyitems, pytest_configure  # noqa: E402,F401
