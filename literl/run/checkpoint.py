"""Checkpoints: model (Hugging Face format), optimizer, scheduler, RNG states and data position.

Every write goes to a temporary directory that is renamed into place only when complete, so a crash or a
Ctrl-C mid-write never leaves a half checkpoint where a resume would find it.

    <run>/checkpoints/step_000040/model/           save_pretrained: config, safetensors, tokenizer
    <run>/checkpoints/step_000040/trainer_state.pt optimizer, scheduler, RNGs, prompt-stream position, step
    <run>/checkpoints/step_000040/config.yaml      the run's resolved config when the checkpoint was written
    <run>/checkpoints/latest                       name of the newest complete checkpoint
    <run>/final/                                   the trained model, loadable by transformers and vLLM, in the
                                                   compute dtype (model.dtype; checkpoints keep the float32
                                                   master weights)

Loading is safe on files from elsewhere: trainer_state.pt holds only tensors and plain data (RNG states
included) and is read with `torch.load(weights_only=True)`, which runs no code; `latest` can only name a
`step_<n>` folder inside `checkpoints/`. A checkpoint that cannot be read (a corrupt or foreign file) is
moved aside as `corrupt-step_<n>` and the previous one is used, with a note naming the bad file.
"""

from __future__ import annotations

import errno
import os
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from literl.data.files import write_text_atomic
from literl.model.lora import is_lora, load_adapter_state

STEP_NAME = re.compile(r"step_\d+")
REQUIRED_STATE = ("step", "optimizer", "scheduler", "rng", "stream")
# What literl's own interrupted saves leave behind, by exact name and per folder of the run (nothing else there is
# ever deleted: a user's `.old-backup/` is not literl's): save_model's and save_checkpoint's `.tmp-<name>-<pid>` /
# `.old-<name>-<pid>` folders, and write_atomic's `.<file>.<mkstemp letters>.tmp` for the files literl writes.
RUN_FILES = ("config.yaml", "run.json", "metrics.jsonl", "eval.jsonl", "samples.jsonl", "diagnostics.json",
             "summary.json")
_ATOMIC = r"\.({})\.[a-z0-9_]+\.tmp"
_TEMPORARIES = {".": re.compile(r"\.(tmp|old)-final-\d+|" + _ATOMIC.format("|".join(map(re.escape, RUN_FILES)))),
                "checkpoints": re.compile(r"\.(tmp|old)-step_\d+-\d+|" + _ATOMIC.format("latest"))}


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be used; the message names the file and the fix."""


class DiskFullError(OSError):
    """A save ran out of disk space; the message names the free space and trainer.keep_checkpoints."""


DISK_FULL_BYTES = 1 << 20      # a save that failed with less free than this ran out of space, whatever it raised


def save_model(directory: Path, model: torch.nn.Module, tokenizer, *, dtype: torch.dtype | None = None) -> Path:
    """Write `model` and `tokenizer` with save_pretrained, atomically replacing `directory`. `dtype`: the model's
    floating weights are written in it and its config.json says so (`final/` in the compute dtype, as Hugging Face
    users expect; the float32 master weights in memory are untouched)."""
    directory = Path(directory)
    tmp = directory.parent / f".tmp-{directory.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        if dtype is not None:
            _convert_saved_weights(tmp, dtype)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    except BaseException as err:
        _give_up_save(err, tmp, directory.parent, f"the model to {directory}", keep=None)
        raise
    _replace_dir(tmp, directory)
    return directory


def _convert_saved_weights(folder: Path, dtype: torch.dtype) -> None:
    """Rewrite a saved model folder's weight files (not its adapter/) with floating tensors in `dtype`, and the
    `dtype` of its config.json. One file at a time, so memory holds one shard and its converted copy."""
    import json

    name = str(dtype).split(".")[-1]
    for file in sorted(folder.glob("*.safetensors")):
        tensors = {key: value.to(dtype) if value.is_floating_point() else value
                   for key, value in load_file(str(file)).items()}
        save_file(tensors, str(file), metadata={"format": "pt"})
    config = folder / "config.json"
    if config.exists():
        data = json.loads(config.read_text(encoding="utf-8"))
        data["dtype"] = name
        config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


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
    """Every RNG's state as tensors and plain data (what `torch.load(weights_only=True)` reads back)."""
    kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(position), int(has_gauss),
                       float(cached_gaussian)],
             "sampling": sampling_rng.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict, sampling_rng: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, position, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.int64).astype(np.uint32), position, has_gauss,
                         cached_gaussian))
    sampling_rng.set_state(state["sampling"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: Path, step: int, *, model, tokenizer, trainer_state: dict, keep: int = 2,
                    config_text: str | None = None) -> Path:
    """Write checkpoint `step` atomically and keep the newest `keep` (0: all).

    Checkpoints beyond `keep` are removed before the new one is written, so the disk needs room for one
    checkpoint besides the ones kept: lowering trainer.keep_checkpoints makes room for the next save.
    """
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    _prune(root, keep, protect=name)
    tmp = root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        model.save_pretrained(tmp / "model", safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "model")
        torch.save({"step": step, **trainer_state}, tmp / "trainer_state.pt")
        if config_text is not None:
            (tmp / "config.yaml").write_text(config_text, encoding="utf-8")
    except BaseException as err:
        _give_up_save(err, tmp, root, f"checkpoint {name}", keep=keep)
        raise
    _replace_dir(tmp, root / name)
    write_text_atomic(root / "latest", name)
    _prune(root, keep, protect=name)
    return root / name


def _complete(root: Path) -> list[Path]:
    """Complete checkpoints (renamed into place, with their trainer state), oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if STEP_NAME.fullmatch(p.name) and (p / "trainer_state.pt").is_file()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def _prune(root: Path, keep: int, *, protect: str) -> None:
    if keep <= 0:
        return
    others = [p for p in _complete(root) if p.name != protect]
    room = keep - 1 if (root / protect).exists() else keep
    for stale in others[:max(0, len(others) - room)]:
        shutil.rmtree(stale, ignore_errors=True)


def _give_up_save(err: BaseException, tmp: Path, where: Path, what: str, *, keep: int | None) -> None:
    """A save failed: remove its partial copy (it would only take more space), and raise DiskFullError when the
    disk is full. torch.save and safetensors report a full disk as RuntimeError / SafetensorError, not
    OSError(ENOSPC), so the free space decides too, measured before the partial copy goes (it is what filled it)."""
    full = isinstance(err, Exception) and _disk_full(err, where)
    shutil.rmtree(tmp, ignore_errors=True)
    if full:
        _raise_disk_full(err, where, what, keep=keep)


def _disk_full(err: Exception, where: Path) -> bool:
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:
        return _free_bytes(where) < DISK_FULL_BYTES
    except OSError:
        return False


def _free_bytes(where: Path) -> int:
    return shutil.disk_usage(where).free


def _raise_disk_full(err: Exception, where: Path, what: str, *, keep: int | None) -> None:
    free = _human(_free_bytes(where)) if where.exists() else "unknown"
    newest = _complete(where)[-1:] if keep is not None else []
    size = f" (about {_human(_tree_size(newest[0]))})" if newest else ""
    keeping = (f"besides the trainer.keep_checkpoints={keep} it keeps" if keep else
               "besides every checkpoint (trainer.keep_checkpoints=0 keeps all)") if keep is not None else ""
    cause = " ".join(str(err).split())[:200]
    raise DiskFullError(errno.ENOSPC, (
        f"no space left on the device while writing {what}: {free} free in {where} after removing the partial "
        f"copy ({type(err).__name__}: {cause}). A save needs room for one checkpoint{size} {keeping}. Free some "
        f"space, lower trainer.keep_checkpoints (the next save removes the older ones before writing), or move "
        f"trainer.output_dir to a larger disk; then continue with trainer.resume=true. Nothing already saved was "
        f"lost.").replace("  ", " ")) from None


def _tree_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Delete what literl's interrupted saves left behind (`.tmp-final-<pid>`, `checkpoints/.tmp-step_<n>-<pid>`
    and their `.old-` twins, `.<file>.<random>.tmp` of the files literl writes), by exact name: nothing else.

    Call it only while holding the run directory's lock: then no other process is writing them.
    """
    removed = []
    for sub, temporary in _TEMPORARIES.items():
        folder = Path(run_dir) / sub
        if not folder.is_dir():
            continue
        for entry in folder.iterdir():
            if temporary.fullmatch(entry.name):
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
                removed.append(entry)
    return removed


def checkpoint_candidates(run_dir: Path, notes: list[str] | None = None) -> list[Path]:
    """Complete checkpoints, the one `checkpoints/latest` names first, then the others newest first.

    `latest` is only a hint: a name that is not a `step_<n>` folder of this run is ignored (with a note).
    """
    root = Path(run_dir) / "checkpoints"
    complete = _complete(root)[::-1]
    pointer = root / "latest"
    if not pointer.is_file():
        return complete
    try:
        name = pointer.read_bytes().decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        name, problem = None, f"cannot be read ({err})"
    else:
        problem = None if STEP_NAME.fullmatch(name) else f"names {name[:80]!r}, not a step_<n> folder of this run"
    chosen = next((p for p in complete if p.name == name), None)
    if problem is None and chosen is None:
        problem = f"names {name}, which is not a complete checkpoint"
    if problem:
        if notes is not None:
            notes.append(f"{pointer} {problem}: ignoring it and using the newest complete checkpoint")
        return complete
    return [chosen] + [p for p in complete if p != chosen]


def latest_checkpoint(run_dir: Path) -> Path | None:
    candidates = checkpoint_candidates(run_dir)
    return candidates[0] if candidates else None


@dataclass
class Resumed:
    path: Path
    state: dict
    notes: list[str] = field(default_factory=list)


def load_latest_checkpoint(run_dir: Path, model: torch.nn.Module) -> Resumed | None:
    """Load the newest usable checkpoint into `model`; None when there is none.

    A checkpoint whose files cannot be read is moved aside (`corrupt-step_<n>`) and the previous one is tried;
    the notes say which file was bad. A checkpoint that reads but does not fit the model is the caller's
    mistake (another model.path), not damage: that raises at once and nothing is moved.
    """
    notes: list[str] = []
    candidates = checkpoint_candidates(run_dir, notes)
    for path in candidates:
        try:
            state = load_checkpoint(path, model)
        except CheckpointError as err:
            aside = _move_aside(path)
            notes.append(f"{err}; moved it to {aside.name} and fell back to the previous checkpoint")
            continue
        return Resumed(path, state, notes)
    if candidates:
        raise CheckpointError(f"no checkpoint of {run_dir} could be read: " + "; ".join(notes))
    return None


def _move_aside(path: Path) -> Path:
    target = path.with_name(f"corrupt-{path.name}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"corrupt-{path.name}-{n}")
    os.replace(path, target)
    return target


def load_checkpoint(path: Path, model: torch.nn.Module) -> dict:
    """Load weights into `model` in place; return the trainer state (optimizer, scheduler, RNGs, ...).

    Raises CheckpointError naming the file when a file is missing, damaged or holds anything but tensors and
    plain data; RuntimeError when the weights do not match the model.
    """
    path = Path(path)
    state_file = path / "trainer_state.pt"
    try:
        with torch.serialization.safe_globals(_numpy_rng_globals()):
            state = torch.load(state_file, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - pickle, zip and I/O errors come in many types
        raise CheckpointError(f"{state_file} cannot be read safely ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200] if str(err) else 'no detail'})") from None
    missing_keys = [k for k in REQUIRED_STATE if not isinstance(state, dict) or k not in state]
    if missing_keys:
        raise CheckpointError(f"{state_file} is not a literl trainer state (missing {', '.join(missing_keys)})")
    if is_lora(model):      # a LoRA policy: its checkpoints hold the adapter only
        load_adapter(model, path / "model")
        return state
    weights = sorted((path / "model").glob("*.safetensors"))
    if not weights:
        raise CheckpointError(f"checkpoint {path} has no model weights ({path / 'model'}/*.safetensors)")
    state_dict = {}
    for file in weights:
        try:
            state_dict.update(load_file(str(file)))
        except Exception as err:  # noqa: BLE001 - safetensors raises its own error type
            raise CheckpointError(f"{file} cannot be read ({type(err).__name__}: {err})") from None
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    # Tied embeddings are saved once; the tied lm_head weight is legitimately "missing".
    missing = [k for k in missing if not _is_tied(model, k)]
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {path} does not match the model: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}; resume with the run's own model.path")
    return state


def load_adapter(model: torch.nn.Module, directory: Path) -> None:
    """Restore a LoRA policy's adapters from a checkpoint's model folder (written by peft's save_pretrained). A
    damaged or missing adapter file is a CheckpointError (resume falls back to the previous checkpoint); a
    checkpoint of a run without LoRA, or with other LoRA settings, is a RuntimeError naming the fix."""
    path = directory / "adapter_model.safetensors"
    if not path.is_file():
        if any(directory.glob("model*.safetensors")):
            raise RuntimeError(f"{directory} holds a full model and no adapter_model.safetensors, so it is a "
                               "checkpoint of a run without LoRA; resume it with model.lora.rank=0")
        raise CheckpointError(f"checkpoint {directory.parent} has no adapter weights ({path})")
    try:
        weights = load_file(str(path))
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error type
        raise CheckpointError(f"{path} cannot be read ({type(err).__name__}: {err})") from None
    load_adapter_state(model, weights, directory)


def _numpy_rng_globals() -> list:
    """What a numpy uint32 array needs to unpickle: checkpoints of earlier literl versions kept numpy's RNG state
    as an array. Rebuilding an array runs no code (its elements go through the same restricted unpickler)."""
    try:
        from numpy._core.multiarray import _reconstruct     # numpy >= 2
    except ImportError:
        from numpy.core.multiarray import _reconstruct
    # Named as numpy 1 and numpy 2 wrote it, so either version's checkpoints load under either.
    names = ("numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct")
    return [(_reconstruct, name) for name in names] + [np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def non_finite_parameters(model: torch.nn.Module) -> list[str]:
    """Names of the parameters holding NaN or ±inf (none for a healthy model)."""
    return [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]


def _is_tied(model: torch.nn.Module, key: str) -> bool:
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    inp = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return out is not None and inp is not None and out.weight is inp.weight and key.endswith("lm_head.weight")
