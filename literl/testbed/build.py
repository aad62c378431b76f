"""Build one testbed variant into a folder: warm-up (gated on a useful accuracy band), optional
alignment, held-out measurement, `save_pretrained`, and `manifest.json`.

The gate is what makes the warm-up robust: a fixed-time warm-up on a shared machine trains for a
varying number of steps, and an unlucky seed can end far below the useful range (the notes saw 10%
sampled accuracy, after which RL did nothing). Here the warm-up runs a fixed number of steps, then its
sampled accuracy on a validation set (train split, never the held-out set) is checked; below the band
it trains further, and outside the band after that it restarts from another seed, and finally fails
with the whole history rather than handing RL a useless model.

Determinism: same recipe, same code, same torch build and CPU thread count give bitwise-identical
weights (the build pins `recipe.num_threads`; a different thread count or CPU changes float reduction
order, so weights then differ in the last bits and accuracies by a point or two).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import time
from pathlib import Path

import torch
import transformers
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from literl.testbed.measure import PolicyMeasurement, measure_policy
from literl.testbed.model import build_model, count_parameters, load_model_dir, save_model_dir
from literl.testbed.progress import BuildProgress
from literl.testbed.recipes import (ALIGNMENT_DATA_SEED_OFFSET, CODE_VERSION, EXTENSION_DATA_SEED_OFFSET,
                                    SEED_RETRY_STRIDE, TestbedRecipe)
from literl.testbed.tasks import PROMPT_SUFFIX, heldout_problems, make_problems
from literl.testbed.tokenizer import build_char_tokenizer
from literl.testbed.warmup import SFTPhase, run_sft

MANIFEST_NAME = "manifest.json"


class TestbedBuildError(RuntimeError):
    """The warm-up could not produce a model in the useful accuracy range."""

    __test__ = False   # not a pytest test class despite the name


@contextlib.contextmanager
def pinned_torch_threads(num_threads: int):
    """Run with a fixed torch CPU thread count (reproducible float reductions), then restore it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _train_phase(model, tokenizer, phase: SFTPhase, *, data_seed: int, label: str,
                 progress: BuildProgress) -> int:
    progress.phase(label, phase.steps)
    return run_sft(model, tokenizer, phase, data_seed=data_seed,
                   on_step=lambda step, loss, lr: progress.step(step, loss))


def _validate(model, tokenizer, recipe: TestbedRecipe, validation: list[dict]) -> PolicyMeasurement:
    m = recipe.measure
    return measure_policy(model, tokenizer, validation, samples_per_problem=m.samples_per_problem,
                          max_new_tokens=m.max_new_tokens, seed=m.sampling_seed)


def _check(label: str, seed: int, steps: int, result: PolicyMeasurement, progress: BuildProgress) -> dict:
    progress.note(f"{label} (seed {seed}, {steps} steps): validation sampled accuracy "
                  f"{result.sampled_accuracy:.1%}, greedy {result.greedy_accuracy:.1%}, "
                  f"token entropy {result.mean_token_entropy:.3f}")
    return {"label": label, "seed": seed, "steps": steps, "sampled_accuracy": round(result.sampled_accuracy, 4),
            "greedy_accuracy": round(result.greedy_accuracy, 4),
            "mean_token_entropy": round(result.mean_token_entropy, 4)}


def warm_up_in_band(recipe: TestbedRecipe, tokenizer: PreTrainedTokenizerBase, validation: list[dict],
                    progress: BuildProgress) -> tuple[PreTrainedModel, int, list[dict]]:
    """Fresh model + slipped SFT, repeated until validation accuracy is in the gate's band.

    Returns (model, seed actually used, history of every check).
    """
    gate = recipe.gate
    history: list[dict] = []
    attempts = 1 if gate is None else gate.max_seed_retries + 1
    for attempt in range(attempts):
        seed = recipe.seed + SEED_RETRY_STRIDE * attempt
        model = build_model(recipe.shape, tokenizer, seed=seed, experts=recipe.experts)
        steps = _train_phase(model, tokenizer, recipe.warmup, data_seed=seed,
                             label=f"warm-up (seed {seed})", progress=progress)
        if gate is None:
            return model, seed, history
        result = _validate(model, tokenizer, recipe, validation)
        history.append(_check("warm-up", seed, steps, result, progress))
        for extension in range(gate.max_extensions):
            if result.sampled_accuracy >= gate.low:
                break
            steps += _train_phase(model, tokenizer, gate.extension,
                                  data_seed=seed + EXTENSION_DATA_SEED_OFFSET + extension,
                                  label=f"extra warm-up {extension + 1}", progress=progress)
            result = _validate(model, tokenizer, recipe, validation)
            history.append(_check(f"extra warm-up {extension + 1}", seed, steps, result, progress))
        if gate.low <= result.sampled_accuracy <= gate.high:
            return model, seed, history
        progress.note(f"seed {seed} ended outside the useful band [{gate.low:.0%}, {gate.high:.0%}]"
                      + ("; retrying with a new seed" if attempt + 1 < attempts else ""))
    raise TestbedBuildError(
        f"the {recipe.variant!r} warm-up never reached validation sampled accuracy in "
        f"[{gate.low:.0%}, {gate.high:.0%}] after {attempts} seeds; checks: {json.dumps(history)}. "
        "Change the recipe (steps, lr, slip_rate) or the gate.")


def align(model: PreTrainedModel, recipe: TestbedRecipe, tokenizer: PreTrainedTokenizerBase,
          seed: int, progress: BuildProgress) -> int:
    """The SFT phase on top of the parent model: clean solutions for `aligned` (lowers entropy, raises accuracy),
    another tier or slip rate for the regimes (docs/testbed.md). With `recipe.router_scale` the MoE routers are
    scaled first and held fixed through the phase (`flatten_routers`)."""
    phase = recipe.alignment
    label = ("alignment (clean solutions)" if phase.slip_rate == 0 and phase.tier == "mixed"
             else f"continuation ({phase.tier} tier, slip rate {phase.slip_rate:g})")
    frozen = flatten_routers(model, recipe.router_scale) if recipe.router_scale is not None else []
    try:
        return _train_phase(model, tokenizer, phase, data_seed=seed + ALIGNMENT_DATA_SEED_OFFSET, label=label,
                            progress=progress)
    finally:
        for parameter in frozen:
            parameter.requires_grad_(True)


@torch.no_grad()
def flatten_routers(model: PreTrainedModel, scale: float) -> list[torch.nn.Parameter]:
    """Multiply every MoE router's weights by `scale` (0 < scale) and stop their gradients; return them.

    The router's logits z = W h scale by the same factor, so every token keeps its top-k experts while the margin
    between the k-th and the (k+1)-th logit shrinks by `scale`: a smaller update then moves routes. The top-k
    weights flatten too (softmax of scaled logits), which the following SFT phase lets the experts adapt to; the
    routers stay fixed through it so that it cannot grow the margins back."""
    from literl.model.moe import is_sparse_moe

    if not scale > 0:
        raise ValueError(f"router_scale must be > 0 (got {scale})")
    gates = [layer.mlp.gate for layer in model.get_decoder().layers if is_sparse_moe(getattr(layer, "mlp", None))]
    if not gates:
        raise ValueError("router_scale needs a mixture-of-experts model (a recipe with experts)")
    for gate in gates:
        gate.weight.mul_(scale)
        gate.weight.requires_grad_(False)
    return [gate.weight for gate in gates]


def build_testbed(recipe: TestbedRecipe, out_dir: Path, *, progress: BuildProgress,
                  base_dir: Path | None = None) -> dict:
    """Build `recipe` into the existing folder `out_dir` and return its manifest.

    A recipe with an alignment phase starts from the built base in `base_dir` (its `base_recipe()`).
    """
    if recipe.alignment is not None and base_dir is None:
        raise ValueError(f"variant {recipe.variant!r} aligns a base model: pass the built base as base_dir")
    started = time.monotonic()
    tokenizer = build_char_tokenizer()
    m = recipe.measure
    validation = make_problems(m.validation_problems, split="train", tier=m.tier, seed=m.validation_seed, unique=True)
    with pinned_torch_threads(recipe.num_threads):
        if recipe.alignment is None:
            model, seed, history = warm_up_in_band(recipe, tokenizer, validation, progress)
            base_manifest = None
        else:
            base_manifest = read_manifest(base_dir)
            model = load_model_dir(base_dir)
            seed, history = base_manifest["seed_used"], []
            steps = align(model, recipe, tokenizer, seed, progress)
            history.append(_check("alignment", seed, steps, _validate(model, tokenizer, recipe, validation),
                                  progress))
        heldout = measure_policy(model, tokenizer, heldout_problems(m.heldout_problems, tier=m.tier),
                                 samples_per_problem=m.samples_per_problem, max_new_tokens=m.max_new_tokens,
                                 seed=m.sampling_seed)
        save_model_dir(model, tokenizer, out_dir)
    manifest = _manifest(recipe, tokenizer, model, seed, history, heldout, time.monotonic() - started)
    if base_manifest is not None:
        # build_seconds above counts this folder's phases only; the base's own build time is here
        manifest["base"] = {key: base_manifest[key] for key in ("folder", "build_seconds", "heldout")}
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    progress.note(f"held-out ({m.heldout_problems} problems): sampled accuracy {heldout.sampled_accuracy:.1%} "
                  f"(T=1, {m.samples_per_problem} samples each), greedy {heldout.greedy_accuracy:.1%}, "
                  f"token entropy {heldout.mean_token_entropy:.3f}; built in {manifest['build_seconds']:.0f} s")
    return manifest


def _manifest(recipe: TestbedRecipe, tokenizer: PreTrainedTokenizerBase, model: torch.nn.Module, seed: int,
              history: list[dict], heldout: PolicyMeasurement, seconds: float) -> dict:
    return {
        "variant": recipe.variant,
        "folder": recipe.folder_name(),
        "recipe_hash": recipe.recipe_hash(),
        "code_version": CODE_VERSION,
        "recipe": recipe.to_dict(),
        "seed_used": seed,
        "build_seconds": round(seconds, 1),
        "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "num_parameters": count_parameters(model),
        "heldout": heldout.to_dict(),
        "checks": history,
        "prompt_format": {
            "template": "raw: the problem string verbatim, no BOS, no chat wrapper",
            "example_prompt": f"What is 3+4*5-2{PROMPT_SUFFIX}",
            "example_response": "4*5=20\n3+20=23\n23-2=21\n\\boxed{21}<eos>",
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "max_new_tokens": recipe.measure.max_new_tokens,
        },
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "torch_threads": recipe.num_threads,
    }


def read_manifest(folder: Path) -> dict:
    """The manifest of a built testbed folder."""
    path = Path(folder) / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {folder} is not a built testbed")
    return json.loads(path.read_text())

