"""Asynchronous rollouts with bounded staleness (`rollout.max_staleness = k >= 1`, docs/async.md).

The trainer's loop does not change: it still calls `collector.collect(rng)` and `engine.sync_weights(weights)` once
per step. Behind those two calls the work overlaps:

    trainer (main thread)                          producer (a thread of its own)
      batch s   ← AsyncCollector.collect()   ◄──── queue of finished batches (at most k ahead)
      update on batch s                              batch s+1 … s+k: Collector.collect() on the engine,
      VersionedEngine.sync_weights(θ)   ───────►     under the policy version its schedule names
        (a snapshot: version s+1)                    (WeightVersions; the engine loads it between requests)

**The schedule.** Batch s is generated under policy version v(s) = max(floor, s − k), where version v is the
weights after v steps (0: the starting policy) and `floor` is the version the producer started from (0, or the
step a run resumed at). Which version a batch sees is fixed by this rule, never by which thread finished first,
so a seed repeats its run bit for bit whatever the machine's load (each batch also samples with a generator
seeded from (seed, s), not from a stream shared with the trainer). After the first k steps every token is exactly
k versions old: k is both the bound and the staleness, a controlled variable for the arena. With
`partial_rollouts` (literl's own engine only), decode steps from `switch_step(T) = max(1, T // 2)` on sample
under the next version, min(v(s) + 1, s), loaded between two decode steps of the running batch (the KV cache of the
tokens before stays, as in PipelineRL); each token carries the version that sampled it.

**What rides on the batch.** `policy_version_BT` (long, −1 on padding): the version that sampled each token;
`rollout_staleness_BT` = s − version at the step s that trains it. The rollout log-probs are the engine's
(the behaviour policy μ); the objective's old-log-prob pass recomputes π_old with the trainer's weights at the
step's start (the proximal policy of AReaL's decoupled objective), so IS corrections and MiniRL weight by
π_old/μ, which now holds the version gap as well as the numerical one (algorithms.md §7; per-staleness metrics
split them). A row whose staleness exceeds k (only possible when a run resumes with a smaller k than the one its
checkpoint was written with) is dropped with its whole group and counted (`async/dropped_rows`), never trained.

**Checkpoints** save the in-flight batches: a checkpoint after step s waits until batches s … s+k−1 (the ones
sampled under versions older than the checkpoint's weights) are finished and stores them with the prompt
stream's position after them; a resume trains them as they were and generates the rest under the checkpoint's
weights, so resuming is exact. Memory: at most k finished batches wait for the trainer, plus the weight snapshots
of the versions still to be generated from (at most k + 1 copies of the weights).
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
from collections import deque
from typing import Callable

import torch

from literl.algorithm.batch import POLICY_VERSION, STALENESS, RolloutBatch
from literl.rollout.engine import Generation, SamplingParams
from literl.rollout.native_engine import NativeEngine
from literl.rollout.versions import Stopped, VersionedEngine, WeightVersions, detached_copy
from literl.run.step_outcomes import StepStopped

JOIN_SECONDS = 30.0


def batch_version(step: int, max_staleness: int, floor: int = 0) -> int:
    """v(s) = max(floor, s − k): the policy version batch `step` starts sampling under."""
    return max(floor, step - max_staleness)


def switch_step(max_new_tokens: int) -> int:
    """The first decode step that samples under the next version with partial rollouts."""
    return max(1, max_new_tokens // 2)


def batch_seed(seed: int, step: int) -> int:
    """The seed of batch `step`'s sampling generator: fixed by (run seed, step), independent of thread timing."""
    digest = hashlib.sha256(f"literl-async-rollout:{seed}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % 2**63


class _AtVersion:
    """The engine as the inner collector sees it while it collects batch `step`: every generation samples under
    the batch's scheduled version(s) and comes back with `policy_version_BT` on its extras."""

    def __init__(self, engine: VersionedEngine, version: int, next_version: int | None, switch: int,
                 on_wait: Callable[[float], None], stopped: Callable[[], bool]):
        self.engine, self.version, self.next_version, self.switch = engine, version, next_version, switch
        self.on_wait, self.stopped = on_wait, stopped
        # literl's own engine takes a hook between decode steps (the next version, or a stop); others run whole
        self._hooked = isinstance(engine.engine, NativeEngine)

    def generate(self, prompts, params: SamplingParams, *, rng=None) -> Generation:
        if self.stopped():
            raise Stopped()
        generation = self.engine.generate_at(self.version, prompts, params, rng=rng, on_wait=self.on_wait,
                                             before_step=self._before_step if self._hooked else None)
        T = generation.mask_BT.shape[1]
        version_BT = torch.full(generation.mask_BT.shape, self.version, dtype=torch.long)
        if self.next_version is not None and T > self.switch:
            version_BT[:, self.switch:] = self.next_version
        generation.extras[POLICY_VERSION] = torch.where(generation.mask_BT, version_BT, torch.full_like(version_BT, -1))
        return generation

    def _before_step(self, t: int) -> None:
        if self.stopped():
            raise Stopped()
        if self.next_version is not None and t == self.switch:
            self.engine.load(self.next_version, self.on_wait)


# ------------------------------------------------------------------------------------------------ the producer
@dataclasses.dataclass
class _Ready:
    batch: RolloutBatch
    metrics: dict
    stream_after: dict          # the prompt stream's position after this batch was drawn


class AsyncCollector:
    """`collect()` hands the trainer batch s from a producer thread that runs the synchronous `Collector` up to k
    batches ahead, on the schedule of the module docstring. Also: `position()` / `rewind()` (a failed step puts its
    batch back), `state_dict()` / `load_state_dict()` (checkpoints with the batches in flight), `shutdown()`.

    `threaded=False` produces each batch when the trainer asks for it, on the same schedule: the same numbers as
    the threaded run, with no overlap (what the tests compare the threaded run against)."""

    def __init__(self, inner, engine: VersionedEngine, *, max_staleness: int, seed: int, steps: int,
                 partial_rollouts: bool = False, threads: int | None = None, trainer_threads: int | None = None,
                 threaded: bool = True):
        if max_staleness < 1:
            raise ValueError("AsyncCollector needs max_staleness >= 1 (0 is the synchronous Collector)")
        self.inner, self.engine, self.k, self.seed, self.steps = inner, engine, max_staleness, seed, steps
        self.partial_rollouts, self.threads, self.trainer_threads = partial_rollouts, threads, trainer_threads
        self.threaded = threaded
        self.floor = 0                  # the version the schedule starts from (the step a run resumed at)
        self._next_consume = 0          # the step whose batch the trainer takes next
        self._next_produce = 0          # the next batch the producer draws
        self._ready: dict[int, _Ready] = {}
        self._stream_before: dict[int, dict] = {}
        self._taken: tuple[int, _Ready] | None = None
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._stopping = False
        # timing of the overlap, for the per-step metrics
        self._busy: deque[tuple[float, float]] = deque()     # the producer's finished generate+reward intervals
        self._busy_since: float | None = None
        self._engine_idle = 0.0
        self._last_return = time.perf_counter()

    @property
    def stream(self):
        return self.inner.stream

    # ------------------------------------------------------------------------------------------ the trainer's side
    def collect(self, rng: torch.Generator | None = None, *, stop: Callable[[], bool] | None = None
                ) -> tuple[RolloutBatch, dict[str, float]]:
        """The batch of the next step (`rng` is not used: each batch samples with its own seeded generator). A stop
        request (`stop`, the trainer's) while waiting for the producer raises `StepStopped`."""
        asked = time.perf_counter()
        step = self._next_consume
        self.engine.versions.advance_to(step)
        if self.threaded:
            self._start()
            with self._cond:
                while step not in self._ready and self._error is None:
                    if stop is not None and stop():
                        raise StepStopped(f"stopped while waiting for the batch of step {step + 1}")
                    self._cond.wait(0.5)
                self._raise_if_failed()
                ready = self._ready.pop(step)
                self._next_consume = step + 1
                self._cond.notify_all()
        else:
            if step not in self._ready:
                self._produce(step)
            ready = self._ready.pop(step)
            self._next_consume = step + 1
        got = time.perf_counter()
        self._taken = (step, ready)
        batch, metrics = self._bounded(step, ready.batch, dict(ready.metrics))
        metrics.update(self._timing(asked, got))
        self.engine.versions.release_below(self._oldest_needed())
        return batch, metrics

    def position(self) -> dict:
        return {"next_step": self._next_consume}

    def rewind(self, position: dict) -> None:
        """Back to `position()` taken before the step that failed: its batch goes back to the front."""
        step = int(position["next_step"])
        if step == self._next_consume:
            return
        if self._taken is None or self._taken[0] != step or self._next_consume != step + 1:
            raise RuntimeError(f"cannot rewind the rollout queue from step {self._next_consume} to {step}")
        with self._cond:
            self._ready[step] = self._taken[1]
            self._next_consume = step
            self._taken = None
            self._cond.notify_all()

    def state_dict(self) -> dict:
        """The prompt stream's position and the in-flight batches (those sampled under versions older than the
        trainer's current weights), waiting for the producer to finish them."""
        V = self._next_consume
        self.engine.versions.advance_to(V)      # the trainer holds version V (published, or unchanged by an empty step)
        # Batches sampled under versions older than V (the schedule's, and any a resume brought from a run with a
        # larger k): no weights file keeps their versions, so they are saved, not regenerated.
        scheduled = [t for t in range(V, min(V + self.k, self.steps)) if batch_version(t, self.k, self.floor) < V]
        if not self.threaded:
            for t in scheduled:
                if t not in self._ready:
                    self._produce(t)
        with self._cond:
            needed = sorted(set(scheduled) | {t for t in self._ready if t >= V})
            if needed:
                self._start()
            while any(t not in self._ready for t in needed) and self._error is None and not self._stopping:
                self._cond.wait(0.5)
            saved = []
            for t in needed:            # after a producer failure: the finished prefix (the rest is regenerated)
                if t not in self._ready:
                    break
                saved.append(t)
            if saved:
                stream = self._ready[saved[-1]].stream_after
            elif V in self._stream_before:
                stream = self._stream_before[V]
            else:
                stream = self.inner.stream.state_dict()
            batches = [{"step": t, "batch": _batch_state(self._ready[t].batch), "metrics": self._ready[t].metrics}
                       for t in saved]
        return {"stream": stream, "rollouts_in_flight": {"max_staleness": self.k, "batches": batches}}

    def load_state_dict(self, state: dict) -> None:
        """Resume at step `state["step"]` (a checkpoint's): its in-flight batches wait for the trainer as they were;
        the producer draws the next ones after them, from the checkpoint's weights on."""
        if self._thread is not None:
            raise RuntimeError("load the collector's state before the first collect()")
        V = int(state["step"])
        self.inner.stream.load_state_dict(state["stream"])
        saved = (state.get("rollouts_in_flight") or {}).get("batches", [])
        self._ready = {int(b["step"]): _Ready(_batch_from_state(b["batch"]), dict(b["metrics"]), state["stream"])
                       for b in saved}
        self._next_consume = V
        self._next_produce = V + len(saved)
        self.floor = V
        self.engine.versions.restart_at(V)
        self.engine.loaded = None

    def shutdown(self) -> None:
        """Stop the producer: it abandons the batch it is generating (a checkpoint never needs it: checkpoints are
        written between steps, with the in-flight batches finished)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self.engine.versions.stop()
        if self._thread is not None:
            self._thread.join(JOIN_SECONDS)

    # ------------------------------------------------------------------------------------------ the schedule
    def _bounded(self, step: int, batch: RolloutBatch, metrics: dict) -> tuple[RolloutBatch, dict]:
        """Staleness of every token at this step; rows (with their whole group) beyond k dropped and counted."""
        version_BT = batch.extras.get(POLICY_VERSION)
        if version_BT is None:
            raise RuntimeError("an asynchronous batch without policy_version_BT: the producer did not tag it")
        staleness_BT = torch.where(batch.mask_BT, step - version_BT, torch.full_like(version_BT, -1))
        too_old_B = (staleness_BT > self.k).any(-1)
        dropped = 0
        if bool(too_old_B.any()):
            bad_groups = torch.unique(batch.group_B[too_old_B])
            keep_B = ~torch.isin(batch.group_B, bad_groups)
            dropped = int((~keep_B).sum())
            batch = batch.select(torch.nonzero(keep_B).flatten())
            staleness_BT = staleness_BT[keep_B]
        batch.extras[STALENESS] = staleness_BT
        metrics.update(staleness_metrics(staleness_BT, batch.mask_BT, self.k))
        metrics["async/dropped_rows"] = float(dropped)
        metrics["async/dropped_frac"] = dropped / max(dropped + len(batch), 1)
        return batch, metrics

    def _oldest_needed(self) -> int:
        return batch_version(self._next_produce, self.k, self.floor) if self._next_produce < self.steps else \
            self.engine.versions.latest

    # ------------------------------------------------------------------------------------------ the producer
    def _start(self) -> None:
        if self._thread is not None or not self.threaded:
            return
        self._thread = threading.Thread(target=self._run, name="literl-rollout-producer", daemon=True)
        self._thread.start()
        if self.trainer_threads:
            torch.set_num_threads(self.trainer_threads)     # this thread's own count (OpenMP's is per thread)

    def _run(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            while True:
                with self._cond:
                    waited = time.perf_counter()
                    while not self._stopping and not self._may_produce(self._next_produce):
                        self._cond.wait(0.5)
                    self._engine_idle += time.perf_counter() - waited
                    if self._stopping:
                        return
                    t = self._next_produce
                self._produce(t)
        except Stopped:
            return
        except BaseException as err:        # noqa: BLE001 - handed to the trainer's thread
            with self._cond:
                self._error = err
                self._cond.notify_all()

    def _may_produce(self, t: int) -> bool:
        return t < self.steps and t < self._next_consume + self.k

    def _produce(self, t: int) -> None:
        version = batch_version(t, self.k, self.floor)
        next_version = min(version + 1, t) if self.partial_rollouts and version + 1 <= t else None
        with self._cond:
            self._stream_before[t] = self.inner.stream.state_dict()
            for old in [s for s in self._stream_before if s < self._next_consume]:
                del self._stream_before[old]
            self._busy_since = time.perf_counter()
        rng = torch.Generator().manual_seed(batch_seed(self.seed, t))
        self.inner.engine = _AtVersion(self.engine, version, next_version,
                                       switch_step(self.inner.sampling.max_new_tokens), self._add_idle,
                                       lambda: self._stopping)
        batch, metrics = self.inner.collect(rng)
        batch.forward_record = None
        metrics["async/version"] = float(version)
        with self._cond:
            self._ready[t] = _Ready(batch, metrics, self.inner.stream.state_dict())
            self._next_produce = t + 1
            self._busy.append((self._busy_since, time.perf_counter()))
            self._busy_since = None
            self._cond.notify_all()

    def _add_idle(self, seconds: float) -> None:
        with self._cond:
            self._engine_idle += seconds

    def _raise_if_failed(self) -> None:
        """The producer's own error, raised again in the trainer's thread: the run ends as a synchronous run would
        on it (one line for a known failure such as RewardsFailing), not wrapped in a second traceback."""
        if self._error is not None:
            error = self._error
            if not any("rollout producer" in note for note in getattr(error, "__notes__", [])):
                error.add_note("(raised in the rollout producer thread of an asynchronous run)")
            raise error

    def _timing(self, asked: float, got: float) -> dict[str, float]:
        """trainer idle = its wait for the batch; engine idle = the producer's waits (for a free slot or a version)
        since the last step; overlap = the share of the trainer's working time (from the last batch handed out to
        this request) during which the producer was generating."""
        with self._cond:
            work_start, work = self._last_return, max(asked - self._last_return, 1e-9)
            busy = list(self._busy) + ([(self._busy_since, asked)] if self._busy_since is not None else [])
            overlap = sum(max(0.0, min(end, asked) - max(start, work_start)) for start, end in busy)
            while self._busy and self._busy[0][1] < asked:
                self._busy.popleft()
            engine_idle, self._engine_idle = self._engine_idle, 0.0
        self._last_return = got
        return {"time/trainer_idle": got - asked, "time/engine_idle": engine_idle,
                "time/overlap_frac": min(overlap / work, 1.0)}


def staleness_metrics(staleness_BT: torch.Tensor, mask_BT: torch.Tensor, max_staleness: int) -> dict[str, float]:
    """Per token of the trained batch: mean and max staleness and the histogram over 0..k (fractions)."""
    values = staleness_BT[mask_BT].float()
    n = max(values.numel(), 1)
    out = {"async/staleness_mean": float(values.sum()) / n,
           "async/staleness_max": float(values.max()) if values.numel() else 0.0}
    for j in range(max_staleness + 1):
        out[f"async/staleness_frac_{j}"] = float((values == j).sum()) / n
    return out


def _batch_state(batch: RolloutBatch) -> dict:
    """A rollout batch as tensors and plain data (what `torch.load(weights_only=True)` reads back)."""
    return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch) if f.name != "forward_record"}


def _batch_from_state(state: dict) -> RolloutBatch:
    return RolloutBatch(**state)


__all__ = ["AsyncCollector", "VersionedEngine", "WeightVersions", "batch_version",
           "batch_seed", "switch_step", "staleness_metrics", "detached_copy"]
