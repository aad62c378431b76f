"""Diagnostics computed alongside training (no gradient, not tricks): logged, never optimised."""

from literl.diagnostics.importance import is_decomposition, mismatch_metrics

__all__ = ["is_decomposition", "mismatch_metrics"]
