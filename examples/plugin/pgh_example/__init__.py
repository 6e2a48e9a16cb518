"""An example plugin for pg-advantage-harness: see its pyproject.toml and docs/extending.md."""
