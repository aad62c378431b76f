"""Default profiles: what the keys left null (`rollout.max_new_tokens`, sampling, `optim.lr`, `eval.benchmarks`,
`data.system_prompt`) mean for the embedded testbed and for a real Hugging Face model.

`model.profile=auto` picks `real` when the policy is a Hugging Face model (`model.path` set, or a model passed
to `literl.train`) and `testbed` otherwise; `literl.config.load.resolve` fills the nulls from the chosen
profile and writes the concrete values into the run's config.yaml. A key set explicitly always wins.

    key                      testbed                  real (the seed study's setup, algorithms.md §8.1)
    rollout.max_new_tokens   64                       8192, capped to fit the model's context (below)
    rollout.temperature      1.0                      0.99
    rollout.top_p            1.0 (off)                0.99
    rollout.top_k            0 (off)                  100
    optim.lr                 5e-5 (tuned, testbed.md) 1e-6
    eval.benchmarks          [testbed]                MATH-500, AIME24, AIME25, AMC23, Minerva, OlympiadBench
                                                      (from data.dir or $LITERL_DATA_DIR; none when neither is set)
    data.system_prompt       none                     "Please reason step by step, and put your final answer
                                                      within \\boxed{}." (chat templates only)

Context: the study's 8192-token responses after 1024-token prompts assume a long-context model. The real
profile keeps min(1024, C/2) positions of a C-position model for the prompt and caps max_new_tokens at the
rest (C = 32768: 8192; C = 4096: 3072; C = 512: 256), with a note.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from literl.data.prompts import INSTRUCTION as SEED_STUDY_INSTRUCTION   # §8.1's system prompt

PROFILES = ("auto", "testbed", "real")
SEED_STUDY_PROMPT_LENGTH = 1024
SEED_STUDY_RESPONSE_LENGTH = 8192
REAL_BENCHMARKS = ("math500", "aime24", "aime25", "amc23", "minerva", "olympiadbench")
TESTBED_LR = 5e-5      # tuned on the testbed (docs/testbed.md); 3e-4 collapsed it in the prototype
HF_MODEL_LR = 1e-6     # LitePPO paper §3.1
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


@dataclass(frozen=True)
class Profile:
    name: str
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    lr: float
    benchmarks: tuple[str, ...]
    system_prompt: str


TESTBED = Profile("testbed", max_new_tokens=64, temperature=1.0, top_p=1.0, top_k=0, lr=TESTBED_LR,
                  benchmarks=("testbed",), system_prompt="")
REAL = Profile("real", max_new_tokens=SEED_STUDY_RESPONSE_LENGTH, temperature=0.99, top_p=0.99, top_k=100,
               lr=HF_MODEL_LR, benchmarks=REAL_BENCHMARKS, system_prompt=SEED_STUDY_INSTRUCTION)


def choose_profile(declared: str, *, hf_model: bool) -> Profile:
    """The profile `model.profile` names; auto: real for a Hugging Face model, testbed otherwise."""
    if declared == "auto":
        return REAL if hf_model else TESTBED
    return {"testbed": TESTBED, "real": REAL}[declared]


def response_budget(profile: Profile, context: int | None) -> tuple[int, str | None]:
    """(max_new_tokens, note or None): the profile's response length, capped to fit a `context`-position model."""
    if context is None or profile is TESTBED:
        return profile.max_new_tokens, None
    prompt_room = min(SEED_STUDY_PROMPT_LENGTH, context // 2)
    cap = max(1, context - prompt_room)
    if cap >= profile.max_new_tokens:
        return profile.max_new_tokens, None
    return cap, (f"rollout.max_new_tokens={cap}: the real-model profile's {profile.max_new_tokens} (the seed "
                 f"study's response length) capped so that it fits the model's {context} positions with "
                 f"{prompt_room} left for the prompt; set rollout.max_new_tokens to choose another")


def model_context(model: Any) -> int | None:
    """The longest sequence a model takes (max_position_embeddings or its equivalent), from a model object, its
    config, or a local model directory's config.json; None when it cannot be told (e.g. a hub id)."""
    if model is None:
        return None
    config = getattr(model, "config", model)
    if isinstance(model, (str, os.PathLike)):
        path = Path(model).expanduser() / "config.json"
        if not path.is_file():
            return None
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return _context_in(config) or _context_in(config.get("text_config") or {})
    text_config = getattr(config, "text_config", None)
    return _context_in(config) or (_context_in(text_config) if text_config is not None else None)


def _context_in(config: Any) -> int | None:
    for key in CONTEXT_KEYS:
        value = config.get(key) if isinstance(config, dict) else getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def data_dir_available(data_dir: str | None) -> bool:
    """True when benchmark names can be read: data.dir is set, or $LITERL_DATA_DIR is."""
    from literl.data.benchmarks import DATA_DIR_ENV

    return bool(data_dir) or bool(os.environ.get(DATA_DIR_ENV))
