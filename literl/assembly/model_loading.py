"""Loading the policy: the embedded testbed, a Hugging Face model directory, or a module passed in."""

from __future__ import annotations

from pathlib import Path

import torch


def load_policy(cfg, *, model=None, tokenizer=None, console=None):
    """Return (policy, tokenizer, is_testbed)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if isinstance(model, torch.nn.Module):
        if tokenizer is None:
            raise ValueError("a model object was passed without its tokenizer; pass tokenizer=... as well")
        return model, tokenizer, False
    path = model if model is not None else cfg.model.path
    is_testbed = path is None
    if is_testbed:
        from literl.testbed import ensure_testbed

        path = ensure_testbed(cfg.model.testbed, progress=cfg.trainer.progress,
                              prebuilt=cfg.model.testbed_prebuilt)
    elif not Path(str(path)).exists() and "/" not in str(path):
        raise FileNotFoundError(f"model.path={path} is neither a directory nor a Hugging Face id; point it at a "
                                "directory saved with save_pretrained")
    try:
        policy = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        tok = tokenizer or AutoTokenizer.from_pretrained(str(path))
    except Exception as err:  # noqa: BLE001 - transformers, safetensors and tokenizers raise many types
        if is_testbed:      # checked against its manifest already: damage that the check could not see
            from literl.testbed.cache import TestbedCacheError

            detail = " ".join(str(err).split())[:300]
            raise TestbedCacheError(f"the cached testbed {path} cannot be loaded ({type(err).__name__}: {detail}). "
                                    "Delete that folder: the next run reinstalls or rebuilds it") from None
        from literl.model.damaged_files import load_failure_message

        damaged = load_failure_message(path, err)
        if damaged:
            raise FileNotFoundError(damaged) from None
        if not isinstance(err, OSError):
            raise
        raise FileNotFoundError(f"could not load a causal LM and tokenizer from '{path}': {err}. Pass a directory "
                                "written by save_pretrained (the hub is only used when it is reachable).") from None
    return policy, tok, is_testbed


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS and the model's (generation) config EOS ids."""
    ids: set[int] = set()
    for source in (tokenizer.eos_token_id, getattr(model.config, "eos_token_id", None),
                   getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    if not ids:
        raise ValueError("the tokenizer and model define no EOS token, so responses could never end; set "
                         "tokenizer.eos_token")
    return sorted(ids)


def pad_token_id(tokenizer) -> int:
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    if tokenizer.eos_token_id is not None:
        return int(tokenizer.eos_token_id)
    raise ValueError("the tokenizer has neither a pad nor an EOS token; set tokenizer.pad_token")
