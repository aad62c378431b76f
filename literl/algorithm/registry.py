"""Registries: the only bridge between config names and trick functions.

Every axis of variation (advantages, policy losses, aggregation, ...) owns one `Registry`. An entry is a
plain function registered under its own `__name__`, so `grep "def cispo"` finds the code that
`algorithm.policy_loss.name=cispo` runs. Parameters are keyword-only with paper defaults; `build`
checks a config's params against the signature when the config loads, so a typo fails at once.

Some parameters describe the run rather than the trick (the Dr.GRPO constant is "the max generation
length"). Such a parameter may default to `None` and name a *context* key (`max_new_tokens`); `build`
fills it from the context when the config leaves it unset.

Valid ranges are declared next to the function, in its `register` call, and checked with the names when a
config loads (`literl config --explain` shows them):

    @REWARD_SHAPING.register(ranges={"low": "< high"})
    @POLICY_LOSSES.register(ranges={"eps_low": ">= 0 and <= 1", "dual_clip": "> 1"})

A range is clauses `OP OPERAND` joined by `and`; OP is one of < <= > >=, OPERAND a number or another parameter
of the same function. A parameter left at None (off) is not checked, nor a clause whose operand is None.

How a trick goes with the rest of the config is declared there too (`compatibility=`): the other axes' tricks it
is defined with (`Expects`), the settings under which it does not do what it is chosen for (`UnderSettings`),
a check against another trick's parameters (`WithTrick`). A declaration names the other tricks and config keys as
strings; `link_axes` checks the names once every axis is registered, and `compatibility_problems` evaluates the
declarations of the tricks a config chooses (`literl.config.rules.validate` calls it):

    @POLICY_LOSSES.register(compatibility=[Expects("aggregation", ("token_mean",), "{name} is defined with ...")])

A trick that changes nothing (`none`, `keep_all`) registers with `identity=True`; rules about "any trick but the
identity" read `Registry.is_identity` instead of comparing names.

A keyword parameter without a default is *required*: a config must give it (OPSM's δ, which the paper leaves
open and frameworks default a thousandfold apart). A trick that needs something of the step besides its
positional tensors (the current policy's entropy, a seeded generator) declares those keyword parameters as
`inputs`; they are not config parameters, and the caller (`literl.algorithm.objective`) supplies them at each call:

    @POLICY_LOSSES.register(inputs=("generator", "entropy_BT"))
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from literl.config.errors import ConfigError

# Where the run's context values come from, for messages about a parameter filled from the context.
CONTEXT_SOURCES = {"max_new_tokens": "rollout.max_new_tokens"}
_COMPARISONS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


class _Required:
    """The default `params_of` shows for a parameter the config must give (a keyword parameter without default)."""

    def __repr__(self) -> str:
        return "<required>"


REQUIRED = _Required()


class Registry:
    """Named functions of one axis, with the same positional signature."""

    def __init__(self, axis: str):
        self.axis = axis
        self._entries: dict[str, Callable] = {}
        self._ranges: dict[str, dict[str, list[tuple[str, float | str]]]] = {}
        self._inputs: dict[str, tuple[str, ...]] = {}
        self._compatibility: dict[str, tuple[Compatibility, ...]] = {}
        self._axes: Mapping[str, Registry] | None = None     # every axis, once `link_axes` has run

    def register(self, fn: Callable | None = None, *, ranges: dict[str, str] | None = None,
                 inputs: tuple[str, ...] = (), compatibility: tuple | list = (), identity: bool = False):
        """Register `fn` under its own name (usable bare, `@R.register`, or `@R.register(ranges={...})`).

        `inputs` names keyword parameters the caller supplies at each call (not config parameters); they are
        also set on the function as `step_inputs`, which the built partial keeps. `compatibility` holds the
        trick's declarations about the rest of the config (`Expects`, `UnderSettings`, `WithTrick`); `identity`
        marks a trick that changes nothing, set on the function as `is_identity` (the objective reads it)."""
        if fn is None:
            return functools.partial(self.register, ranges=ranges, inputs=inputs, compatibility=compatibility,
                                     identity=identity)
        name = fn.__name__
        if name in self._entries:
            raise ValueError(f"{self.axis}: '{name}' is registered twice")
        keyword = {p.name for p in inspect.signature(fn).parameters.values()
                   if p.kind is inspect.Parameter.KEYWORD_ONLY}
        if not set(inputs) <= keyword:
            raise ValueError(f"{self.axis}.{name}: inputs {sorted(set(inputs) - keyword)} are not keyword parameters")
        bad = [d for d in compatibility if not isinstance(d, (Expects, UnderSettings, WithTrick))]
        if bad:
            raise ValueError(f"{self.axis}.{name}: compatibility holds {bad[0]!r}; declare each rule as Expects, "
                             f"UnderSettings or WithTrick (literl.algorithm.registry)")
        self._entries[name] = fn
        self._inputs[name] = tuple(inputs)
        fn.step_inputs = frozenset(inputs)
        if identity:
            fn.is_identity = True
        params = self.params_of(name)
        try:
            self._ranges[name] = {param: _parse_parameter_range(text, f"{self.axis}.{name}", param, params)
                                  for param, text in (ranges or {}).items()}
            self._compatibility[name] = tuple(compatibility)
            if self._axes is not None:
                self._check_declared_names(name)
        except ValueError:
            del self._entries[name]     # a refused registration leaves the registry as it was
            raise
        return fn

    def ranges_of(self, name: str) -> dict[str, str]:
        """The declared valid range of each parameter, as text (`{"low": "< high"}`)."""
        self.get(name)
        return {param: range_text(clauses) for param, clauses in self._ranges[name].items()}

    def compatibility_of(self, name: str) -> tuple[Compatibility, ...]:
        """The entry's declarations about the rest of the config (`register(compatibility=...)`)."""
        self.get(name)
        return self._compatibility[name]

    def is_identity(self, name: str) -> bool:
        """Whether the entry changes nothing (`register(identity=True)`): no IS correction, no group filter."""
        return bool(getattr(self.get(name), "is_identity", False))

    def _check_declared_names(self, name: str) -> None:
        """Every axis and trick a declaration of `name` names must exist: a typo fails when the trick registers."""
        assert self._axes is not None
        for declaration in self._compatibility[name]:
            for axis, other in declaration.tricks_named():
                where = f"{self.axis}.{name}: a compatibility declaration ({type(declaration).__name__}) names"
                if axis not in self._axes:
                    raise ValueError(f"{where} the axis {axis!r}, which does not exist (axes: "
                                     f"{', '.join(self._axes)}); name one of them")
                if other not in self._axes[axis]:
                    raise ValueError(f"{where} {axis} {other!r}, which is not registered (registered: "
                                     f"{', '.join(self._axes[axis].names())}); fix the name, or register that "
                                     f"trick first")

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
        """Keyword-only config parameters of an entry with their defaults (the single source of truth); a required
        one shows `REQUIRED`. The step inputs the entry declares are not config parameters."""
        sig = inspect.signature(self.get(name))
        inputs = self._inputs.get(name, ())
        return {
            p.name: REQUIRED if p.default is inspect.Parameter.empty else p.default
            for p in sig.parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in inputs
        }

    def inputs_of(self, name: str) -> tuple[str, ...]:
        """The keyword parameters the caller supplies at each call (`register(inputs=...)`)."""
        self.get(name)
        return self._inputs[name]

    def required_of(self, name: str) -> list[str]:
        """The config parameters without a default."""
        return [k for k, v in self.params_of(name).items() if v is REQUIRED]

    def check(self, name: str, params: dict[str, Any] | None, *, where: str = "",
              context: dict[str, Any] | None = None) -> None:
        """Raise ConfigError if `name` is unknown, `params` holds a key the function does not take, or a value
        lies outside its declared range (unset params named in `context` are checked with the context's value)."""
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
        missing = [k for k in self.required_of(name) if (params or {}).get(k) is None]
        if missing:
            raise ConfigError(f"{where or self.axis}: {self.axis} '{name}' needs {', '.join(missing)}, which has no "
                              f"default; set it in the trick's params (docs/algorithms.md documents the values "
                              f"papers and frameworks use)")
        self._check_ranges(name, params or {}, where or f"{self.axis}.{name}", context or {})

    def _check_ranges(self, name: str, params: dict[str, Any], where: str, context: dict[str, Any]) -> None:
        values = dict(self.params_of(name))
        values.update(params)
        from_context = {k for k, v in values.items() if v is None and k in context and k not in params}
        values.update({k: context[k] for k in from_context})

        def shown(param: str) -> str:
            source = CONTEXT_SOURCES.get(param, f"the run's {param}")
            origin = f" (unset, so taken from {source})" if param in from_context else ""
            return f"{param}={values[param]!r}{origin}"

        for param, clauses in self._ranges[name].items():
            value = values.get(param)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{where}: {param} must be a number, got {type(value).__name__} {value!r}")
            if not math.isfinite(value):
                raise ConfigError(f"{where}: {param}={value} must be a finite number")
            broken = broken_clause(value, clauses, values.get)
            if broken is not None:
                op, operand, bound = broken
                against = shown(operand) if isinstance(operand, str) else f"{bound:g}"
                raise ConfigError(f"{where}: {shown(param)} must be {op} {against} (valid range of "
                                  f"{self.axis}.{name}.{param}: {self.ranges_of(name)[param]})")

    def build(self, name: str, params: dict[str, Any] | None = None, *, where: str = "",
              context: dict[str, Any] | None = None) -> Callable:
        """Return `fn` with its configured params bound; unset `None` params named in `context` are filled."""
        self.check(name, params, where=where, context=context)
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


# ---------------------------------------------------------------------------------------------- the range grammar
# Shared with the config's knobs (`literl.config.schema.knob(range=...)`), whose operands are config keys.
Clause = tuple[str, "float | str"]


def parse_range(text: str, where: str, is_name: Callable[[str], bool]) -> list[Clause]:
    """'>= 0 and < high' -> [('>=', 0.0), ('<', 'high')]; an operand is a number or a name `is_name` accepts."""
    clauses: list[Clause] = []
    for clause in text.split(" and "):
        op, _, operand = clause.strip().partition(" ")
        operand = operand.strip()
        if op not in _COMPARISONS or not operand:
            raise ValueError(f"{where}: bad range clause {clause!r} (want e.g. '>= 0' or '< high')")
        if is_name(operand):
            clauses.append((op, operand))
            continue
        try:
            clauses.append((op, float(operand)))
        except ValueError:
            raise ValueError(f"{where}: range operand {operand!r} is neither a number nor a parameter") from None
    return clauses


def range_text(clauses: list[Clause]) -> str:
    """[('>=', 0.0), ('<', 'high')] -> '>= 0 and < high'."""
    return " and ".join(f"{op} {operand if isinstance(operand, str) else format(operand, 'g')}"
                        for op, operand in clauses)


def broken_clause(value: float, clauses: list[Clause], value_of: Callable[[str], Any]):
    """The first clause `value` breaks, as (op, operand, bound), or None. A named operand is looked up with
    `value_of`; a clause whose bound is unset (None) or not a number (reported on its own) holds."""
    for op, operand in clauses:
        bound = value_of(operand) if isinstance(operand, str) else operand
        if bound is None or isinstance(bound, bool) or not isinstance(bound, (int, float)):
            continue
        if not _COMPARISONS[op](value, bound):
            return op, operand, bound
    return None


def _parse_parameter_range(text: str, owner: str, param: str, params: dict[str, Any]) -> list[Clause]:
    """A trick parameter's range: its operands are the function's other parameters; a typo fails at import."""
    if param not in params:
        raise ValueError(f"{owner}: a range is declared for '{param}', which is not a keyword parameter")
    return parse_range(text, f"{owner}.{param}", params.__contains__)


# ---------------------------------------------------------------------------------------------- compatibility
# What a declaration sees of the config: the chosen tricks of every axis, name -> params with the defaults filled
# in (one entry on a single-trick axis), and `setting(key)`, a config key's value.
Chosen = Mapping[str, Mapping[str, Mapping[str, Any]]]


@dataclass(frozen=True)
class Expects:
    """The trick is defined with one of `names` on another `axis`; any other choice there is a problem, a warning
    (or an error, `error=True`). `message` may say {name} (this trick) and {other} (the other axis's choice)."""

    axis: str
    names: tuple[str, ...]
    message: str
    error: bool = False

    def tricks_named(self) -> list[tuple[str, str]]:
        return [(self.axis, other) for other in self.names]

    def problem(self, name: str, params: Mapping[str, Any], chosen: Chosen, setting) -> str | None:
        others = list(chosen.get(self.axis, {}))
        if any(other in self.names for other in others):
            return None
        return self.message.format(name=name, other=", ".join(others) or "none")


@dataclass(frozen=True)
class UnderSettings:
    """Config settings under which the trick does not do what it is chosen for: a problem when every key in
    `settings` holds its value (`{"trainer.minibatches": 1}`). `message` may say {name}."""

    settings: Mapping[str, Any]
    message: str
    error: bool = False

    def tricks_named(self) -> list[tuple[str, str]]:
        return []

    def problem(self, name: str, params: Mapping[str, Any], chosen: Chosen, setting) -> str | None:
        values = {key: setting(key) for key in self.settings}     # every key read: a wrong one fails each time
        if all(values[key] == wanted for key, wanted in self.settings.items()):
            return self.message.format(name=name)
        return None


@dataclass(frozen=True)
class WithTrick:
    """When `name` on `axis` is chosen too, `check(own_params, other_params)` (both with defaults filled in) says
    what goes wrong between the two, or None."""

    axis: str
    name: str
    check: Callable[[Mapping[str, Any], Mapping[str, Any]], "str | None"]
    error: bool = False

    def tricks_named(self) -> list[tuple[str, str]]:
        return [(self.axis, self.name)]

    def problem(self, name: str, params: Mapping[str, Any], chosen: Chosen, setting) -> str | None:
        other = chosen.get(self.axis, {})
        return self.check(params, other[self.name]) if self.name in other else None


Compatibility = Expects | UnderSettings | WithTrick


def link_axes(registries: Mapping[str, Registry]) -> None:
    """Let every registry see the others, and check the names every declaration gives: run once, when all the
    built-in tricks have registered (a trick registered later, a user's, is checked as it registers)."""
    for registry in registries.values():
        registry._axes = registries
    for registry in registries.values():
        for name in registry.names():
            registry._check_declared_names(name)


def compatibility_problems(registries: Mapping[str, Registry], chosen: Mapping[str, Mapping[str, Any]],
                           setting: Callable[[str], Any]) -> list[tuple[bool, str]]:
    """(is_error, message) for each declaration the chosen tricks break, axis by axis in `chosen`'s order.
    `chosen`: axis -> {trick name: its configured params}; `setting(key)`: a config key's value."""
    full = {axis: {name: {**registries[axis].params_of(name), **(params or {})} for name, params in names.items()}
            for axis, names in chosen.items()}
    problems = []
    for axis, names in full.items():
        for name, params in names.items():
            for declaration in registries[axis].compatibility_of(name):
                message = declaration.problem(name, params, full, setting)
                if message:
                    problems.append((declaration.error, message))
    return problems
