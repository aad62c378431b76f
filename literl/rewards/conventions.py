"""The three reward-function conventions literl accepts, told apart by the function's signature.

    literl  f(response: str, example: dict) -> float
            one response per call; `example` is the problem record ({"id", "problem", "answer", ...}).
    trl     f(prompts: list, completions: list, **columns) -> list[float | None]
            TRL's GRPOTrainer convention: the whole batch in one call, by keyword. `prompts` are the problem
            texts, `completions` the responses, and every other field of the problem records is passed as a
            keyword list (`answer=[...]`, `id=[...]`, `solution=[...]` when the data has it). With a chat
            prompt template, prompts and completions are message lists as in TRL's conversational format
            (`completions[i][0]["content"]` is the text). None (TRL: "does not apply") counts as 0.
    verl    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict
            verl's custom_reward_function convention, by keyword, one response per call:
            data_source = the record's `data_source` field (else ""), solution_str = the response,
            ground_truth = the record's `answer`, extra_info = the whole record. A dict result gives
            its "score" (verl's reward managers read the same key).

Detection (`detect_convention`): a parameter named `completions` means trl, one named `solution_str` means
verl, and a function that takes two positional arguments and neither name is literl's. A signature that
fits several (say `f(*args, **kwargs)`) or none is an error that names the fix: rename the parameters, or
state the convention (`reward.fns.<i>.convention=trl`, or `(fn, weight, "trl")` in Python).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

CONVENTIONS = ("literl", "trl", "verl")
TRL_MARK, VERL_MARK = "completions", "solution_str"
SIGNATURES = {
    "literl": "f(response, example) -> float",
    "trl": "f(prompts, completions, **columns) -> list[float]",
    "verl": "compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float",
}


def detect_convention(fn: Callable, declared: str = "auto", *, name: str | None = None) -> str:
    """The convention `fn` follows: `declared` when it is not "auto" (checked against the signature), else
    read off the signature. Raises ValueError with the fix when the signature fits none or several."""
    label = name or getattr(fn, "__name__", repr(fn))
    if declared not in ("auto", *CONVENTIONS):
        raise ValueError(f"reward function {label!r}: convention {declared!r} is not one of auto, "
                         f"{', '.join(CONVENTIONS)}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):     # builtins without a signature: only a declared convention can tell
        return "literl" if declared == "auto" else declared
    fits = [c for c in CONVENTIONS if _fits(signature, c)]
    if declared != "auto":
        if declared not in fits:
            raise ValueError(f"reward function {label!r} is declared {declared} but its signature {signature} "
                             f"cannot take that call: {SIGNATURES[declared]}")
        return declared
    params = signature.parameters
    named = {n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL
             and p.kind is not inspect.Parameter.VAR_KEYWORD and p.kind is not inspect.Parameter.POSITIONAL_ONLY}
    hinted = [c for c, mark in (("trl", TRL_MARK), ("verl", VERL_MARK)) if mark in named]
    if len(hinted) == 1 and hinted[0] in fits:
        return hinted[0]
    plain = [p for p in params.values() if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                      inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if not hinted and "literl" in fits and plain:
        return "literl"
    fix = ("name its parameters as one convention does, or state it: reward.fns.<i>.convention=<literl|trl|verl> "
           "in a config, (fn, weight, '<convention>') in Python")
    conventions = "; ".join(f"{c}: {s}" for c, s in SIGNATURES.items())
    if not fits:
        raise ValueError(f"reward function {label!r} must accept (response: str, example: dict) or one of the "
                         f"other conventions ({conventions}); its signature is {signature}. "
                         "Its parameters decide: 'completions' means trl, 'solution_str' means verl")
    candidates = hinted if len(hinted) > 1 else fits
    raise ValueError(f"reward function {label!r} has an ambiguous signature {signature}: it could be called as "
                     f"{' or as '.join(candidates)}. To fix it, {fix}")


def _fits(signature: inspect.Signature, convention: str) -> bool:
    try:
        if convention == "literl":
            signature.bind("response", {})
        elif convention == "trl":
            params = signature.parameters
            has_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
            # TRL passes prompts and the columns too; a function naming only what it uses is fine (literl passes
            # only the names a function takes when it has no **kwargs).
            if TRL_MARK not in params and not has_kwargs:
                return False
            signature.bind_partial(completions=[])
        else:
            signature.bind(**_verl_keywords(signature, "", "", "", {}))
    except TypeError:
        return False
    return True


# ---------------------------------------------------------------------------------------------- calling
def call_literl(fn: Callable, response: str, example: dict, **kwargs) -> Any:
    return fn(response, example, **kwargs)


def call_verl(fn: Callable, response: str, example: dict) -> Any:
    """One verl compute_score call; a dict result gives its "score"."""
    value = fn(**_verl_keywords(inspect.signature(fn), example.get("data_source", ""), response,
                                example.get("answer"), example))
    if isinstance(value, dict):
        if "score" not in value:
            raise ValueError(f"returned a dict without a 'score' key (keys: {sorted(value)})")
        value = value["score"]
    return value


def _verl_keywords(signature: inspect.Signature, data_source, solution_str, ground_truth, extra_info) -> dict:
    offered = {"data_source": data_source, "solution_str": solution_str, "ground_truth": ground_truth,
               "extra_info": extra_info}
    return _accepted(signature, offered)


def check_trl_columns(fn: Callable, columns: dict[str, list], *, name: str) -> None:
    """A TRL-style function that names a column the records lack is a setup error, not a bad response: raise
    (before any call) instead of scoring every response 0."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    required = [n for n, p in params.items() if p.default is inspect.Parameter.empty
                and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    missing = [n for n in required if n not in ("prompts", "completions", *columns)]
    if missing:
        raise ValueError(
            f"reward function {name!r} (TRL convention) needs the column(s) {', '.join(missing)}, which the problem "
            f"records do not have; it is given prompts, completions and the records' fields: "
            f"{', '.join(sorted(columns)) or '(none)'}. The gold answer is 'answer' (data.answer_field chooses "
            "which field of the data it is read from)")


def call_trl(fn: Callable, prompts: Sequence, completions: Sequence, columns: dict[str, list]) -> list:
    """One batched TRL call; returns one value per completion (None counts as 0)."""
    offered = {"prompts": list(prompts), "completions": list(completions), **columns}
    values = fn(**_accepted(inspect.signature(fn), offered))
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ValueError(f"returned {type(values).__name__}, not a list with one reward per completion")
    values = list(values)
    if len(values) != len(completions):
        raise ValueError(f"returned {len(values)} rewards for {len(completions)} completions")
    return [0.0 if v is None else v for v in values]


def _accepted(signature: inspect.Signature, offered: dict) -> dict:
    """The offered keywords the function takes: all of them with **kwargs, else only its named parameters."""
    params = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(offered)
    return {k: v for k, v in offered.items() if k in params}


def trl_columns(examples: Sequence[dict]) -> dict[str, list]:
    """Every field of the records except the problem text (TRL passes the dataset's other columns this way)."""
    keys = list(dict.fromkeys(k for ex in examples for k in ex if k != "problem"))
    return {k: [ex.get(k) for ex in examples] for k in keys}


# Worker-process entry points: the isolated runner calls functions by import path with plain data.
def call_verl_by_path(fn_path: str, response: str, example: dict) -> Any:
    from literl.rewards.isolation import resolve_function

    return call_verl(resolve_function(fn_path), response, example)


def call_trl_by_path(fn_path: str, prompts: list, completions: list, columns: dict) -> list:
    from literl.rewards.isolation import resolve_function

    return call_trl(resolve_function(fn_path), prompts, completions, columns)
