"""run.json: what a run was given and where it ran, beside its config.yaml (docs/run-directory.md).

config.yaml replays a run only if everything the run used is named in it. What `literl.train` receives from
Python is not always nameable: `record_inputs` writes into the config what can be (a model directory, a data
file or benchmark name, reward functions importable by path) and describes the rest — a model or tokenizer
object, a list of problems, a lambda — by class, size and a hash of the problems. run.json then says that the
run cannot be replayed from config.yaml and why, config.yaml carries the same warning as a comment, and
`literl train --config` refuses such a file (`replay_problem`) instead of silently training the testbed,
unless the command line names the keys that replace what is missing.

    {"format": 1, "replayable": bool, "not_replayable": [{"input", "what", "key"}],
     "sessions": [{"started", "resume", "inputs": {...}, "not_replayable": [...], "provenance": {...},
                   "engine": {"name", ...}}]}

A resumed run appends a session; the run is replayable only if every session was.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import torch

from literl.config.schema import Config, RewardFnSpec
from literl.data.files import write_json_atomic
from literl.run.provenance import provenance
from literl.rewards.functions import importable_path

RUN_RECORD = "run.json"
FORMAT = 1


@dataclasses.dataclass
class Inputs:
    """What a run was given besides its config: `described` (JSON-ready, per input) and `missing` (what
    config.yaml cannot name: {"input", "what", "key"}, key being the config key that would replace it)."""

    described: dict
    missing: list[dict]

    @property
    def replayable(self) -> bool:
        return not self.missing


def record_inputs(cfg: Config, *, model: Any = None, tokenizer: Any = None, problems: Any = None,
                  reward_fns: Sequence | None = None) -> tuple[Config, Inputs]:
    """The config with every nameable input written into it, and the description of all of them."""
    described: dict[str, Any] = {}
    missing: list[dict] = []
    if isinstance(model, (str, Path)):
        cfg = _replace(cfg, "model", path=str(model))
        described["model"] = {"path": str(model)}
    elif model is not None:
        described["model"] = _describe_model(model)
        missing.append({"input": "model", "key": "model.path",
                        "what": f"a {type(model).__name__} object passed from Python (config.yaml's model.path "
                                f"{'names ' + repr(cfg.model.path) if cfg.model.path else 'is null: the testbed'})"})
    if tokenizer is not None:
        described["tokenizer"] = _describe_tokenizer(tokenizer)
        if not missing or missing[0]["input"] != "model":
            missing.append({"input": "tokenizer", "key": "model.path",
                            "what": f"a {type(tokenizer).__name__} object passed from Python (a replay loads "
                                    "the tokenizer saved with the model instead)"})
    if isinstance(problems, (str, Path)):
        cfg = _replace(cfg, "data", train=str(problems))
        described["problems"] = {"source": str(problems)}
    elif problems is not None:
        rows = list(problems)
        described["problems"] = _describe_problems(rows)
        missing.append({"input": "problems", "key": "data.train",
                        "what": f"{len(rows):,} problems passed from Python as a list (sha256 "
                                f"{described['problems']['sha256'][:12]}…)"})
    if reward_fns is not None:
        specs, entries = [], []
        for item in reward_fns:      # f, 'pkg.mod:fn', (f, weight) or (f, weight, convention)
            fn, weight, convention = (*item, "auto")[:3] if isinstance(item, tuple) else (item, 1.0, "auto")
            path = fn if isinstance(fn, str) else importable_path(fn)
            entries.append({"fn": path or _callable_name(fn), "weight": float(weight), "convention": convention,
                            "importable": bool(path)})
            specs.append(RewardFnSpec(fn=path, weight=float(weight), convention=convention) if path else None)
        described["reward_fns"] = entries
        if all(specs):
            cfg = _replace(cfg, "reward", fns=specs)
        else:
            names = ", ".join(e["fn"] for e in entries if not e["importable"])
            missing.append({"input": "reward_fns", "key": "reward.fns",
                            "what": f"reward function(s) {names} not importable by path (a lambda, a closure or "
                                    "defined in __main__); config.yaml's reward.fns lists the config's own"})
    return cfg, Inputs(described, missing)


def problems_hash(rows: Sequence[dict]) -> str:
    """sha256 of the problems as canonical JSON (keys sorted, one line each, in order)."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(row, sort_keys=True, default=str, ensure_ascii=False).encode() + b"\n")
    return digest.hexdigest()


def _describe_problems(rows: list) -> dict:
    keys = sorted({k for row in rows if isinstance(row, dict) for k in row})
    first = str(rows[0].get("problem", "")) if rows and isinstance(rows[0], dict) else ""
    return {"count": len(rows), "sha256": problems_hash(rows), "keys": keys, "first_problem": first[:200]}


def _describe_model(model: Any) -> dict:
    config = getattr(model, "config", None)
    out = {"class": f"{type(model).__module__}.{type(model).__qualname__}",
           "name_or_path": getattr(config, "_name_or_path", None) or None,
           "model_type": getattr(config, "model_type", None)}
    if isinstance(model, torch.nn.Module):
        out["parameters"] = sum(p.numel() for p in model.parameters())
    return out


def _describe_tokenizer(tokenizer: Any) -> dict:
    return {"class": type(tokenizer).__name__, "name_or_path": getattr(tokenizer, "name_or_path", None) or None,
            "vocab_size": len(tokenizer) if hasattr(tokenizer, "__len__") else None}


def _callable_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def _replace(cfg: Config, section: str, **changes) -> Config:
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **changes)})


# ---------------------------------------------------------------------------------------------- run.json
def write_run_record(run_dir: Path, inputs: Inputs, *, resume: bool, engine: dict | None = None) -> dict:
    """Write run.json: a new record for a new run, one more session for a resumed one (`resume` asked for and
    a record there to continue; the session's "resume" says whether there was). `engine`: the rollout engine's
    name and, for one in its own environment, what it reports of itself (vLLM's and its torch's versions)."""
    path = Path(run_dir) / RUN_RECORD
    sessions = []
    if resume:
        previous = read_run_record(run_dir)
        sessions = list(previous.get("sessions", [])) if previous else []
    sessions.append({"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "resume": bool(sessions),
                     "inputs": inputs.described, "not_replayable": inputs.missing, "provenance": provenance(),
                     "engine": engine or {}})
    missing = [m for s in sessions for m in s["not_replayable"]]
    record = {"format": FORMAT, "replayable": not missing, "not_replayable": _unique(missing), "sessions": sessions}
    write_json_atomic(path, record)
    return record


def read_run_record(run_dir: Path) -> dict | None:
    path = Path(run_dir) / RUN_RECORD
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def config_header(inputs: Inputs) -> str:
    """YAML comment lines for config.yaml of a run it cannot replay ('' when it can)."""
    if inputs.replayable:
        return ""
    lines = ["# NOT REPLAYABLE from this file alone: this run was given objects from Python that a config",
             "# cannot name (details in run.json). `literl train --config` refuses it unless the command names:"]
    lines += [f"#   {m['key']}=...   instead of {m['what']}" for m in inputs.missing]
    return "\n".join(lines) + "\n"


def replay_problem(config_file: str | Path, given_keys: Sequence[str]) -> str | None:
    """Why training from `config_file` would not replay the run it came from, or None.

    Only a config.yaml with a run.json beside it that says "not replayable" has a problem, and only for the
    inputs whose replacing key (model.path, data.train, reward.fns) the command does not name."""
    config_file = Path(config_file)
    record = read_run_record(config_file.parent)
    if not record or record.get("replayable", True):
        return None
    open_items = [m for m in record.get("not_replayable", [])
                  if not any(k == m["key"] or k.startswith(m["key"] + ".") for k in given_keys)]
    if not open_items:
        return None
    listed = "\n".join(f"  - {m['input']}: {m['what']}; name it with {m['key']}=..." for m in open_items)
    return (f"{config_file} belongs to a run that cannot be replayed from it (see "
            f"{config_file.parent / RUN_RECORD}):\n{listed}\nTraining from it as it is would not train what that "
            f"run trained. Give the missing keys on the command line to train with this config anyway.")


def override_keys(overrides: Sequence[str]) -> list[str]:
    """The dotted keys that `key=value` overrides set (`~key` and `+key=` forms included)."""
    return [item.split("=", 1)[0].lstrip("~+").strip() for item in overrides]


def _unique(items: list[dict]) -> list[dict]:
    seen, out = set(), []
    for item in items:
        marker = json.dumps(item, sort_keys=True)
        if marker not in seen:
            seen.add(marker)
            out.append(item)
    return out
