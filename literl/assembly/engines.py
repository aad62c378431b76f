"""Which engine samples a run's rollouts and which learner updates its policy, decided once, each built finished.

    cluster.address set      Ray rollout workers and FSDP2 trainer ranks (`literl.distributed.start_cluster`)
    rollout.engine=vllm      vLLM in its own process; the in-process learner
    rollout.max_staleness>=1 literl's engine on a detached copy of the weights, sampling in a thread of its own
                             while the update runs (docs/async.md); the in-process learner
    otherwise                literl's engine on the policy module itself, keeping its forward for the update to
                             replay where that pays (CPU); the in-process learner

An asynchronous run then puts the engine behind weight versions and the collector behind a producer thread
(`asynchronous`). The held-out evaluation samples with the rollout engine, or with literl's engine over the
trainer's own weights (`eval_engine`, eval.policy=trainer).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import torch

from literl.config.schema import Config
from literl.model.capabilities import records_forward
from literl.model.precision import MASTER_DTYPE, PRECISIONS, compute_dtype
from literl.model.quantize import WEIGHT_FORMATS
from literl.rollout.native_engine import NativeEngine
from literl.run.console import Console
from literl.run.provenance import default_threads
from literl.assembly.model_loading import eos_token_ids
from literl.training.forwards import policy_forward
from literl.training.learner import InProcessLearner
from literl.training.optim import build_optimizer


def build_learner_and_engine(cfg: Config, *, policy: torch.nn.Module, reference, objective, tokenizer, pad_id: int,
                             device: torch.device, run_dir: Path, console: Console) -> tuple[Any, Any]:
    """(learner, engine) for the run, as the table above says."""
    options = engine_options(cfg, policy, tokenizer, pad_id)
    if cfg.cluster.address is not None:
        from literl.distributed import start_cluster

        engine, learner = start_cluster(cfg, policy=policy, reference=None if reference is None else reference.model,
                                        objective=objective, engine_options=options, run_dir=run_dir,
                                        console=console)
        return learner, engine
    asynchronous = cfg.rollout.max_staleness >= 1
    # Only literl's engine sampling from the policy module itself can keep the forward the update replays.
    replays = cfg.rollout.engine == "native" and not asynchronous
    forward = policy_forward(cfg, policy, record_max_bytes=_record_bytes(cfg, device) if replays else 0)
    optimizer, scheduler = build_optimizer(cfg, policy)
    forward.watch(optimizer)
    learner = InProcessLearner(policy=policy, policy_forward=forward, reference=reference, objective=objective,
                               optimizer=optimizer, scheduler=scheduler,
                               micro_batch_tokens=cfg.trainer.micro_batch_tokens,
                               max_grad_norm=cfg.optim.max_grad_norm, device=device)
    if cfg.rollout.engine == "vllm":
        from literl.rollout.vllm_engine import engine_from_config

        # An asynchronous run's engine works while the trainer does: they split trainer.threads between them.
        engine_cfg = _with_threads(cfg, async_thread_split(cfg)[0]) if asynchronous else cfg
        engine = engine_from_config(engine_cfg, policy, eos_token_ids=options["eos_token_ids"], pad_id=pad_id,
                                    console=console)
    elif asynchronous:
        # A generation thread on its own copy of the weights, no forward record (the update never runs with the
        # weights that sampled).
        from literl.rollout.async_rollout import detached_copy

        engine = NativeEngine(detached_copy(policy), **options)
    else:
        engine = NativeEngine(policy, **options, recorder=forward.recorder)
    return learner, engine


def asynchronous(cfg: Config, collector, engine, learner, console: Console):
    """rollout.max_staleness = k >= 1: the engine samples from weight snapshots of its own, a producer thread runs
    the collector up to k batches ahead (literl/rollout/async_rollout.py, docs/async.md). Returns the engine and the
    collector the trainer sees."""
    from literl.rollout.async_rollout import AsyncCollector, VersionedEngine, WeightVersions

    r = cfg.rollout
    engine_threads = trainer_threads = None
    if isinstance(engine, NativeEngine):
        engine_threads, trainer_threads = async_thread_split(cfg)     # the two threads split the cores
    elif r.engine == "vllm" and cfg.cluster.address is None:
        _, trainer_threads = async_thread_split(cfg)       # the engine process took the rest at its start
        torch.set_num_threads(trainer_threads)
    versions = WeightVersions(learner.policy())
    versions.publish(learner.policy())           # version 0: the starting weights
    versioned = VersionedEngine(engine, versions)
    console.note(f"asynchronous rollouts: batch s is sampled under policy version max(0, s-{r.max_staleness})"
                 + (", responses switch to the next version mid-way (partial rollouts)" if r.partial_rollouts else "")
                 + (f"; generation thread {engine_threads} torch thread(s), update {trainer_threads}"
                    if engine_threads else ""))
    async_collector = AsyncCollector(collector, versioned, max_staleness=r.max_staleness, seed=cfg.seed,
                                     steps=cfg.trainer.steps, partial_rollouts=r.partial_rollouts,
                                     threads=engine_threads, trainer_threads=trainer_threads)
    return versioned, async_collector


def async_thread_split(cfg: Config) -> tuple[int, int]:
    """(engine threads, trainer threads) of an asynchronous run whose engine shares this machine's cores:
    rollout.async_engine_threads (default half of trainer.threads, at least 1) and the rest (at least 1)."""
    threads = cfg.trainer.threads or default_threads()
    engine = cfg.rollout.async_engine_threads or max(1, threads // 2)
    return engine, max(1, threads - engine)


def _with_threads(cfg: Config, threads: int) -> Config:
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, threads=threads))


def eval_engine(cfg: Config, engine, learner, tokenizer, pad_id: int) -> Callable[[], Any]:
    """The engine the held-out evaluation samples with. eval.policy=engine: the rollout engine, what is deployed (an
    FP8, 4-bit or bfloat16 engine's rounded copy of the weights, a vLLM engine, Ray rollout workers).
    eval.policy=trainer: literl's engine over the trainer's own weights (`learner.policy()`: the module itself in one
    process, the driver's copy gathered from the ranks on a cluster), built at the first evaluation: no copy, no
    rounding, so a comparison of training–inference corrections is scored on the policy they trained."""
    if cfg.eval.policy == "engine":
        return lambda: engine
    built: list[NativeEngine] = []

    def trainer_engine() -> NativeEngine:
        # The same module at every call; on a cluster the driver's copy, gathered again after an update.
        policy = learner.policy()
        if not built:       # no own dtype and no rounding: the engine samples from the module itself
            built.append(NativeEngine(policy, **{**engine_options(cfg, policy, tokenizer, pad_id),
                                                 "dtype": None, "weights": None}))
        return built[0]
    return trainer_engine


def engine_options(cfg: Config, policy: torch.nn.Module, tokenizer, pad_id: int) -> dict:
    """NativeEngine's arguments besides the model and the recorder (the same for the rollout workers of a
    cluster)."""
    return dict(eos_token_ids=eos_token_ids(policy, tokenizer), pad_id=pad_id, dtype=_engine_dtype(cfg),
                weights=cfg.rollout.dtype if cfg.rollout.dtype in WEIGHT_FORMATS else None, decode=cfg.rollout.decode,
                compile=cfg.rollout.compile)


def _engine_dtype(cfg: Config) -> torch.dtype | None:
    """The engine's own precision (None: it samples from the policy module itself, whose float32 master weights
    the rollout then computes in); an FP8 or 4-bit engine computes in bfloat16 on weights rounded to its format. A
    bfloat16 engine keeps its own bfloat16 copy, refreshed at every weight sync."""
    if cfg.rollout.dtype in WEIGHT_FORMATS:
        return torch.bfloat16
    dtype = PRECISIONS[cfg.rollout.dtype]
    return None if dtype == MASTER_DTYPE else dtype


def _record_bytes(cfg: Config, device: torch.device) -> int:
    """Memory the rollout may use to keep its forward for the update to replay: trainer.replay_max_gib where the
    replay pays (`capabilities.records_forward`: CPU) and the update computes in the parameters' dtype (a bfloat16
    update over float32 master weights would replay float32 outputs), else 0."""
    if not records_forward(device) or compute_dtype(cfg.model.dtype) != MASTER_DTYPE:
        return 0
    return int(cfg.trainer.replay_max_gib * 2**30)
