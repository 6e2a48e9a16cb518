"""Tasks: control (gymnasium), lm (transformers), toy (exact-gradient)."""
