"""Diagnostics computed alongside training (no gradient, not tricks): logged, never optimised."""

from literl.algorithm.diagnostics.importance import is_decomposition

__all__ = ["is_decomposition"]
