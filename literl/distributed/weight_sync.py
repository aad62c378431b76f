"""Weight sync from the trainer ranks to the rollout workers, over a process group, in bounded buckets.

    trainer ranks ──(FSDP2 all-gather: full_tensor(), every rank)──► rank 0 ──(broadcast, bucket by bucket)──► workers

The sync group holds trainer rank 0 (group rank 0) and every rollout worker (group ranks 1…W). It is a process
group of its own (gloo on CPU, NCCL on GPU) built over a TCP store that rank 0 hosts, beside the trainer ranks'
FSDP group: a worker never joins the trainers' group, and a restarted worker only needs a new sync group.

Both sides cut the parameters (named order, the same model class on each side) into the same buckets: runs of
parameters of one dtype of at most `bucket_bytes` (a larger parameter is a bucket of its own). A bucket is
gathered, flattened, broadcast and copied into the worker's parameters before the next is gathered, so the
extra memory on each side is about two buckets, whatever the model's size. Nothing is written to disk.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta

import torch
import torch.distributed as dist

SYNC_TIMEOUT = timedelta(minutes=5)


def buckets(named_params: list[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[list[int]]:
    """Indices of `named_params` per bucket: consecutive, one dtype, at most `bucket_bytes` unless one alone is
    larger."""
    out: list[list[int]] = []
    size, dtype = 0, None
    for i, (_, param) in enumerate(named_params):
        nbytes = param.numel() * param.element_size()
        if not out or param.dtype != dtype or size + nbytes > bucket_bytes:
            out.append([])
            size, dtype = 0, param.dtype
        out[-1].append(i)
        size += nbytes
    return out


def join_group(host: str, port: int, rank: int, size: int, device: torch.device, *, is_host: bool):
    """This process's member of a sync group (every member must call this at about the same time)."""
    store = dist.TCPStore(host, port, size, is_master=is_host, timeout=SYNC_TIMEOUT, wait_for_workers=False)
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        return dist.ProcessGroupNCCL(store, rank, size, options), store
    return dist.ProcessGroupGloo(store, rank, size, SYNC_TIMEOUT), store


def broadcast(group, tensor: torch.Tensor) -> None:
    """Group rank 0's `tensor` into every member's (in place)."""
    options = dist.BroadcastOptions()
    options.rootRank, options.rootTensor = 0, 0
    group.broadcast([tensor], options).wait()


def full(param: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a parameter (an all-gather over the trainer ranks for an FSDP2 shard)."""
    return param.full_tensor() if hasattr(param, "full_tensor") else param


@torch.no_grad()
def send(named_params: list[tuple[str, torch.Tensor]], bucket_bytes: int, group) -> tuple[int, str | None]:
    """On every trainer rank (the gathers are collectives): gather each bucket; rank 0 (`group` not None)
    broadcasts it. A broadcast that fails (a worker died) stops the broadcasts, never the gathers, so that the
    trainer ranks stay in step. Returns (bytes broadcast, the error or None)."""
    sent, error = 0, None
    for index in buckets(named_params, bucket_bytes):
        fulls = [full(named_params[i][1]).detach() for i in index]
        if group is None or error is not None:
            continue
        flat = torch.cat([t.reshape(-1) for t in fulls])
        try:
            broadcast(group, flat)
        except Exception as err:  # noqa: BLE001 - gloo/NCCL errors of a dead peer have several types
            error = f"{type(err).__name__}: {err}"
            continue
        sent += flat.numel() * flat.element_size()
    return sent, error


@torch.no_grad()
def receive(model: torch.nn.Module, bucket_bytes: int, group) -> int:
    """On a rollout worker: every bucket from group rank 0, copied into `model`'s parameters; returns the bytes."""
    named = list(model.named_parameters())
    received = 0
    for index in buckets(named, bucket_bytes):
        params = [named[i][1] for i in index]
        flat = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        broadcast(group, flat)
        offset = 0
        for param in params:
            param.copy_(flat[offset:offset + param.numel()].view_as(param))
            offset += param.numel()
        received += flat.numel() * flat.element_size()
    return received


def weights_hash(model: torch.nn.Module) -> str:
    """sha256 of every parameter's name, dtype, shape and bytes, in named order."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, param in model.named_parameters():
            tensor = full(param).detach().cpu().contiguous()
            digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
            digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()
