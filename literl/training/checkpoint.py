"""Checkpoints: model (Hugging Face format), optimizer, scheduler, RNG states and data position.

Every write goes to a temporary directory that is renamed into place only when complete, so a crash or a
Ctrl-C mid-write never leaves a half checkpoint where a resume would find it.

    <run>/checkpoints/step_000040/model/           save_pretrained: config, safetensors, tokenizer
    <run>/checkpoints/step_000040/trainer_state.pt optimizer, scheduler, RNGs, prompt-stream position, step
    <run>/checkpoints/latest                       name of the newest complete checkpoint
    <run>/final/                                   the trained model, loadable by transformers and vLLM
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from literl.data.files import write_text_atomic


def save_model(directory: Path, model: torch.nn.Module, tokenizer) -> Path:
    """Write `model` and `tokenizer` with save_pretrained, atomically replacing `directory`."""
    directory = Path(directory)
    tmp = directory.parent / f".tmp-{directory.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    _replace_dir(tmp, directory)
    return directory


def _replace_dir(tmp: Path, final: Path) -> None:
    # rename(2) cannot replace a non-empty directory: move the old one aside first, then drop it.
    old = None
    if final.exists():
        old = final.parent / f".old-{final.name}-{os.getpid()}"
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def rng_state(sampling_rng: torch.Generator) -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
             "sampling": sampling_rng.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict, sampling_rng: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    sampling_rng.set_state(state["sampling"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: Path, step: int, *, model, tokenizer, trainer_state: dict, keep: int = 2) -> Path:
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    tmp = root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save_pretrained(tmp / "model", safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / "model")
    torch.save({"step": step, **trainer_state}, tmp / "trainer_state.pt")
    _replace_dir(tmp, root / name)
    write_text_atomic(root / "latest", name)
    complete = sorted(p for p in root.iterdir() if p.name.startswith("step_"))
    for stale in complete[:-keep] if keep > 0 else []:
        shutil.rmtree(stale, ignore_errors=True)
    return root / name


def latest_checkpoint(run_dir: Path) -> Path | None:
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    if pointer.exists():
        candidate = root / pointer.read_text().strip()
        if (candidate / "trainer_state.pt").exists():
            return candidate
    complete = sorted(p for p in root.glob("step_*") if (p / "trainer_state.pt").exists())
    return complete[-1] if complete else None


def load_checkpoint(path: Path, model: torch.nn.Module) -> dict:
    """Load weights into `model` in place; return the trainer state (optimizer, scheduler, RNGs, ...)."""
    path = Path(path)
    if hasattr(model, "peft_config"):      # a LoRA policy: its checkpoints hold the adapter only
        from literl.training.lora import load_adapter_weights

        load_adapter_weights(model, path / "model")
        return torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    weights = sorted((path / "model").glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(f"checkpoint {path} has no model weights; it is incomplete — delete it to resume "
                                "from the previous one")
    state_dict = {}
    for file in weights:
        state_dict.update(load_file(str(file)))
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    # Tied embeddings are saved once; the tied lm_head weight is legitimately "missing".
    missing = [k for k in missing if not _is_tied(model, k)]
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {path} does not match the model: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
    return torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)


def _is_tied(model: torch.nn.Module, key: str) -> bool:
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    inp = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return out is not None and inp is not None and out.weight is inp.weight and key.endswith("lm_head.weight")
