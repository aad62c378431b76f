"""The one error a bad configuration raises, at load, before anything slow starts."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config names something that does not exist or cannot work; the message says how to fix it."""
