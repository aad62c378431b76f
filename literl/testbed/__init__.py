"""The embedded testbed: literl's default job, which trains a model with RL on a laptop CPU in minutes
with nothing to download.

Task (`tasks`): arithmetic expressions over 1-2 digit integers with +, - and * (every intermediate value
in 0-99), with step-by-step worked solutions, one step per line, ending in `\\boxed{answer}`:

    prompt   "What is 3+4*5-2?\\n"                       (the problem string verbatim; no BOS/chat wrapper)
    response "4*5=20\\n3+20=23\\n23-2=21\\n\\\\boxed{21}" then EOS

Model (`model`): a stock `transformers` Qwen3 (hidden 128, 4 layers, ~0.8 M parameters) with a 100-token
character tokenizer (pad 0, eos 1, bos 2), warmed up by SFT on solutions in which 20% of the steps
carry a slip, so it starts imperfect (held-out sampled accuracy ~30-60%, greedy higher) and RL has
room. Variants: "base", "aligned" (base + clean SFT: lower entropy, higher accuracy), "micro" (tests).

Public API:
    ensure_testbed(variant="base", *, cache_dir=None, progress=True, prebuilt=True) -> pathlib.Path
        Hugging Face folder (AutoModelForCausalLM / AutoTokenizer / vLLM), built and cached on first use
        (base: the weights its recipe built, shipped in `prebuilt/`, are installed instead unless prebuilt=False);
        manifest.json beside the weights records recipe, seed, build time, held-out accuracies, entropy.
    read_manifest(folder) -> dict
    recipe_for(variant) -> TestbedRecipe;  VARIANTS;  TestbedRecipe (dataclasses.replace it to vary a seed)
    make_problems(n, *, split, tier="mixed", seed, slip_rate=0.0, unique=False) -> list[dict]
    train_problems(n, *, tier="mixed", seed=0, slip_rate=0.0);  heldout_problems(n=200, tier="mixed", seed=...)
    is_correct(response, answer) -> bool   (exact integer match of the last \\boxed{})
    measure_policy(model, tokenizer, problems, *, samples_per_problem=4, max_new_tokens=64, seed=0)
    build_char_tokenizer()

Names are imported lazily, so `literl.testbed.tasks` stays usable without importing torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ensure_testbed": "literl.testbed.cache",
    "cache_root": "literl.testbed.cache",
    "TestbedCacheError": "literl.testbed.cache",
    "read_manifest": "literl.testbed.build",
    "TestbedBuildError": "literl.testbed.build",
    "recipe_for": "literl.testbed.recipes",
    "VARIANTS": "literl.testbed.recipes",
    "TestbedRecipe": "literl.testbed.recipes",
    "make_problems": "literl.testbed.tasks",
    "train_problems": "literl.testbed.tasks",
    "heldout_problems": "literl.testbed.tasks",
    "is_correct": "literl.testbed.tasks",
    "TIERS": "literl.testbed.tasks",
    "measure_policy": "literl.testbed.measure",
    "build_char_tokenizer": "literl.testbed.tokenizer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'literl.testbed' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
