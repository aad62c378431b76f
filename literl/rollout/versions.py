"""Policy versions for asynchronous rollouts (`literl.rollout.async_rollout`): snapshots of the trainer's weights
by version number, and the engine that samples from the version it is told to.

Version v is the policy after v training steps (0: the starting weights). The trainer publishes one at every weight
sync; the producer asks the engine for the version its schedule names, and the engine loads it between two
generations (or, for partial rollouts, between two decode steps).
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Callable, Sequence

import torch

from literl.rollout.engine import Generation, SamplingParams

MAX_ENGINE_RESTARTS = 3        # consecutive restarts of a dead engine process before the run stops


class Stopped(Exception):
    """The producer was asked to stop (the run ended or was interrupted)."""


def detached_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of `module` for sampling only: its own tensors, no gradients, eval mode."""
    duplicate = copy.deepcopy(module)
    for param in duplicate.parameters():
        param.grad = None
        param.requires_grad_(False)
    return duplicate.eval()


def _as_module(source) -> torch.nn.Module:
    """The module holding the weights an `Engine.sync_weights` call was given: a module, or a handle with
    `module()` (the trainer ranks' weights of a cluster, gathered in this process)."""
    return source if isinstance(source, torch.nn.Module) else source.module()

# ------------------------------------------------------------------------------------------------ weight versions
class WeightVersions:
    """Snapshots of the policy's weights by version number (thread-safe). `publish` copies the trainer's current
    weights into a pooled copy of the model as the next version; `get(v)` waits until version v exists;
    `release_below(v)` returns the copies of older versions to the pool (the newest is always kept)."""

    def __init__(self, policy: torch.nn.Module):
        self._template = policy
        self._snapshots: dict[int, torch.nn.Module] = {}
        self._pool: list[torch.nn.Module] = []
        self._cond = threading.Condition()
        self.latest = -1
        self.stopped = False

    def publish(self, policy: torch.nn.Module) -> int:
        with self._cond:
            target = self._pool.pop() if self._pool else None
        if target is None:
            target = detached_copy(self._template)
        with torch.no_grad():
            for dst, src in zip(target.parameters(), policy.parameters()):
                dst.copy_(src)
            for dst, src in zip(target.buffers(), policy.buffers()):
                dst.copy_(src)
        with self._cond:
            self.latest += 1
            self._snapshots[self.latest] = target
            self._cond.notify_all()
            return self.latest

    def advance_to(self, version: int) -> None:
        """Versions up to `version` exist: a step that trained nothing (an empty batch) published no weights, and
        its version is the one before it, the same snapshot."""
        with self._cond:
            while 0 <= self.latest < version and self.latest in self._snapshots:
                self._snapshots[self.latest + 1] = self._snapshots[self.latest]
                self.latest += 1
            self._cond.notify_all()

    def restart_at(self, version: int) -> None:
        """Forget every snapshot: the next `publish` is `version` (a resumed run's weights)."""
        with self._cond:
            self._pool.extend({id(m): m for m in self._snapshots.values()}.values())
            self._snapshots.clear()
            self.latest = version - 1

    def get(self, version: int, on_wait: Callable[[float], None] | None = None) -> torch.nn.Module:
        with self._cond:
            start = time.perf_counter()
            while self.latest < version and not self.stopped:
                self._cond.wait(0.5)
            if on_wait is not None:
                on_wait(time.perf_counter() - start)
            if self.stopped:
                raise Stopped()
            if version not in self._snapshots:
                raise RuntimeError(f"policy version {version} is no longer held (the oldest held is "
                                   f"{min(self._snapshots, default=None)}); this is a bug in the producer's schedule")
            return self._snapshots[version]

    def release_below(self, version: int) -> None:
        with self._cond:
            for v in [v for v in self._snapshots if v < min(version, self.latest)]:
                module = self._snapshots.pop(v)
                if not any(module is other for other in self._snapshots.values()):     # not a later alias
                    self._pool.append(module)

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
            self._cond.notify_all()

    def held(self) -> list[int]:
        with self._cond:
            return sorted(self._snapshots)


# ------------------------------------------------------------------------------------------------ the engine
class VersionedEngine:
    """The `Engine` the trainer and evaluation see in an asynchronous run, over an engine with its own copy of
    the weights (literl's HF engine on a copy, the vLLM engine's process, Ray rollout workers).

    `sync_weights(policy)` (the trainer, after each step) publishes a snapshot as the next version and returns at
    once: the engine keeps sampling the version its batch was scheduled under. `generate` (evaluation) samples
    under the newest version. `generate_at(version, ...)` (the producer) under a given one. One generation at a
    time; the engine loads a version only between two of them (or, for partial rollouts, between two decode
    steps). A dead engine process (`alive` false, with a `restart(policy)` method: the vLLM engine) is restarted
    from the snapshot of the version it was serving and the generation is retried (`async/engine_restarts`)."""

    def __init__(self, engine, versions: WeightVersions):
        self.engine, self.versions = engine, versions
        self._lock = threading.RLock()
        self.loaded: int | None = None
        self._metrics: dict[str, float] = {}
        self._metrics_lock = threading.Lock()

    # the Engine protocol
    def sync_weights(self, policy) -> dict[str, float]:
        start = time.perf_counter()
        self.versions.publish(_as_module(policy))
        with self._metrics_lock:
            metrics, self._metrics = self._metrics, {}
        metrics["sync/snapshot_seconds"] = time.perf_counter() - start
        return metrics

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, *,
                 rng: torch.Generator | None = None) -> Generation:
        return self.generate_at(self.versions.latest, prompts, params, rng=rng)

    # the producer's side
    def generate_at(self, version: int, prompts, params: SamplingParams, *, rng=None, before_step=None,
                    on_wait=None) -> Generation:
        with self._lock:
            restarts = 0
            rng_state = rng.get_state() if rng is not None else None
            kwargs = {"before_step": before_step} if before_step is not None else {}
            while True:
                self.load(version, on_wait)
                try:
                    return self.engine.generate(prompts, params, rng=rng, **kwargs)
                except Stopped:
                    raise
                except Exception:
                    if not self._restartable() or restarts >= MAX_ENGINE_RESTARTS:
                        raise
                restarts += 1
                self._add_metrics({"async/engine_restarts": 1.0})
                # The same seeds again: the retried generation samples what the lost one would have.
                if rng is not None:
                    rng.set_state(rng_state)
                self.engine.restart(self.versions.get(self.loaded))

    def load(self, version: int, on_wait=None) -> None:
        """Make the engine sample from `version` (waiting until the trainer has published it)."""
        with self._lock:
            if self.loaded == version:
                return
            snapshot = self.versions.get(version, on_wait)
            self._add_metrics(self.engine.sync_weights(snapshot) or {})
            self.loaded = version

    def _restartable(self) -> bool:
        return hasattr(self.engine, "restart") and not getattr(self.engine, "alive", True)

    def _add_metrics(self, metrics: dict) -> None:
        with self._metrics_lock:
            for key, value in metrics.items():
                self._metrics[key] = self._metrics.get(key, 0.0) + float(value)

    # what components and the trainer's run ask of an engine
    def close(self) -> None:
        if hasattr(self.engine, "close"):
            self.engine.close()

    def shutdown(self) -> None:
        if hasattr(self.engine, "shutdown"):
            self.engine.shutdown()

    def __getattr__(self, name: str):
        # eos_token_ids, pad_id, model (evaluation's device), process (the run record): the engine's own
        if name in ("engine", "versions"):
            raise AttributeError(name)
        return getattr(self.engine, name)
