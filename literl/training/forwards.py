"""The log-prob forwards of a run, built from its config in one place: the policy's (the update and the old-log-prob
pass) and the frozen reference's (KL). The single process (`literl.assembly.builder`) and every trainer rank of a
cluster (`literl.distributed.trainer_rank`) build them here, so the two cannot drift apart.
"""

from __future__ import annotations

import torch

from literl.config.schema import Config
from literl.model.policy import PolicyForward
from literl.model.precision import compute_dtype


def policy_forward(cfg: Config, model: torch.nn.Module, *, max_tokens: int | str | None = None,
                   record_max_bytes: int = 0) -> PolicyForward:
    """The policy's forward: sampling temperature, compile, micro-batch size (`max_tokens`, default
    trainer.micro_batch_tokens), Routing Replay and the router's balance loss, the compute dtype and packing.
    `record_max_bytes`: memory the rollout may use to keep its forward for the update to replay (0: never)."""
    return PolicyForward(model, temperature=cfg.rollout.temperature, compile=cfg.trainer.compile,
                         record_max_bytes=record_max_bytes,
                         max_tokens=cfg.trainer.micro_batch_tokens if max_tokens is None else max_tokens,
                         routing_replay=cfg.algorithm.routing_replay,
                         router_aux_loss=cfg.algorithm.router_aux_loss_coef > 0,
                         compute_dtype=compute_dtype(cfg.model.dtype), packed=cfg.trainer.packed_attention)


def reference_forward(cfg: Config, model: torch.nn.Module, *, max_tokens: int | str | None = None) -> PolicyForward:
    """The frozen reference's forward: as the policy's, but it routes its experts naturally (no Routing Replay,
    no balance loss) and records nothing."""
    return PolicyForward(model, temperature=cfg.rollout.temperature, compile=cfg.trainer.compile,
                         max_tokens=cfg.trainer.micro_batch_tokens if max_tokens is None else max_tokens,
                         compute_dtype=compute_dtype(cfg.model.dtype), packed=cfg.trainer.packed_attention)
