"""Registries: the only bridge between config names and trick functions.

Every axis of variation (advantages, policy losses, aggregation, ...) owns one `Registry`. An entry is a
plain function registered under its own `__name__`, so `grep "def cispo"` finds the code that
`algorithm.policy_loss.name=cispo` runs. Parameters are keyword-only with paper defaults; `build`
checks a config's params against the signature when the config loads, so a typo fails at once.

Some parameters describe the run rather than the trick (the Dr.GRPO constant is "the max generation
length"). Such a parameter may default to `None` and name a *context* key (`max_new_tokens`); `build`
fills it from the context when the config leaves it unset.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from typing import Any, Callable, Iterator


class ConfigError(ValueError):
    """A config names something that does not exist or cannot work; the message says how to fix it."""


class Registry:
    """Named functions of one axis, with the same positional signature."""

    def __init__(self, axis: str):
        self.axis = axis
        self._entries: dict[str, Callable] = {}

    def register(self, fn: Callable) -> Callable:
        name = fn.__name__
        if name in self._entries:
            raise ValueError(f"{self.axis}: '{name}' is registered twice")
        self._entries[name] = fn
        return fn

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str) -> Callable:
        if name not in self._entries:
            raise ConfigError(self._unknown_message(name))
        return self._entries[name]

    def params_of(self, name: str) -> dict[str, Any]:
        """Keyword-only parameters of an entry with their defaults (the single source of truth)."""
        sig = inspect.signature(self.get(name))
        return {
            p.name: p.default
            for p in sig.parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        }

    def check(self, name: str, params: dict[str, Any] | None, *, where: str = "") -> None:
        """Raise ConfigError if `name` is unknown or `params` holds a key the function does not take."""
        valid = self.params_of(name)
        unknown = sorted(set(params or {}) - set(valid))
        if unknown:
            hint = ""
            close = difflib.get_close_matches(unknown[0], list(valid), n=1)
            if close:
                hint = f" Did you mean '{close[0]}'?"
            listing = ", ".join(f"{k}={v!r}" for k, v in valid.items()) or "(none)"
            raise ConfigError(
                f"{where or self.axis}: '{name}' has no parameter {', '.join(repr(u) for u in unknown)}.{hint} "
                f"Valid parameters of {self.axis}.{name}: {listing}."
            )

    def build(self, name: str, params: dict[str, Any] | None = None, *, where: str = "",
              context: dict[str, Any] | None = None) -> Callable:
        """Return `fn` with its configured params bound; unset `None` params named in `context` are filled."""
        self.check(name, params, where=where)
        fn = self.get(name)
        bound = dict(params or {})
        for key, default in self.params_of(name).items():
            if key not in bound and default is None and context and key in context:
                bound[key] = context[key]
        partial = functools.partial(fn, **bound)
        functools.update_wrapper(partial, fn)
        return partial

    def _unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(str(name), self.names(), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        return (f"unknown {self.axis} '{name}'.{hint} Valid names: {', '.join(self.names())}. A {self.axis} of your "
                f"own: register it in a module and name the module with --import MODULE (or imports=[MODULE]); "
                f"see docs/custom-tricks.md.")
