"""Collect one rollout batch: sample groups → reward → shape → group filter, repeated until full.

Dynamic sampling is nothing more than this loop with a group filter that drops groups: the collector
keeps sampling fresh prompts until `P` groups survive or `max_rounds` rounds have run, and reports how
many rounds it took. No other part of the loop knows about it.

A step that resamples must still end, and say why it takes long: every PROGRESS_SECONDS of resampling it
reports its round and the groups kept so far; after STALL_ROUNDS rounds in a row that keep no group it stops
resampling: with groups kept before, it trains on them; with none at all (a filter that can never be met, e.g.
a reward band outside the reward's range) it stops the run with `GroupFilterStalled`; and a stop request
(Ctrl-C) is honoured between two rounds (`StepStopped`), so the trainer can save the last complete step instead
of waiting for a step that may never finish.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from literl.algorithm.batch import RolloutBatch, slice_rows
from literl.algorithm.ops import group_mean_std
from literl.rollout.engine import Engine, SamplingParams
from literl.run.step_outcomes import GroupFilterStalled, StepStopped


PROGRESS_SECONDS = 10.0  # a step resampling longer than this says how far it got, then again each time as long
STALL_ROUNDS = 20       # rounds in a row keeping no group before a filter counts as one that cannot be met
MAX_TIERS = 12          # a per-tier curve only makes sense for a few categories
SMALL_GROUP_STD = 0.1   # a group reward std below this (and above 0) counts in groups/small_std_frac


def difficulty_label(problem: dict) -> str:
    """The difficulty category of a problem, for per-tier reward statistics: its `difficulty` field (the
    testbed's operation count), else `tier`, else `level` (MATH); '' when it has none."""
    for key in ("difficulty", "tier", "level"):
        value = problem.get(key)
        if value is not None and value != "":
            return str(value)
    return ""


def tier_labels(problems: Sequence[dict]) -> list[str]:
    """Each problem's tier for the per-tier curves: its `difficulty_label`, '' for none (no curve).

    Decided once over the whole set, so a tier keeps its curve from step to step: numeric labels sort as
    numbers (and are binned to whole numbers when there are more than MAX_TIERS values, e.g. DeepMath's
    half-steps 1.0 … 9.5), and beyond MAX_TIERS only the most common labels get a curve.
    """
    labels = [difficulty_label(p) for p in problems]
    distinct = set(labels) - {""}
    if len(distinct) > MAX_TIERS and all(_is_number(label) for label in distinct):
        labels = [str(math.floor(float(label))) if label else "" for label in labels]
        distinct = set(labels) - {""}
    if len(distinct) > MAX_TIERS:
        common = {label for label, _ in Counter(x for x in labels if x).most_common(MAX_TIERS)}
        labels = [label if label in common else "" for label in labels]
    return labels


def _is_number(label: str) -> bool:
    try:
        return math.isfinite(float(label))
    except ValueError:
        return False


def _tier_order(label: str) -> tuple:
    return (0, float(label), "") if _is_number(label) else (1, 0.0, label)


def _length_spread(lengths: torch.Tensor, correct: torch.Tensor) -> dict[str, float]:
    """How much response lengths differ within the step — what token- vs sequence-level loss weighting acts on
    (a response's tokens weigh 1/L_i each at the sequence level, 1/Σ L at the token level): the coefficient of
    variation, the 10th and 90th percentiles, and the mean length of correct and of wrong responses (absent when
    the step has none of them)."""
    mean = float(lengths.mean())
    spread = {"response_length/cv": float(lengths.std(unbiased=False)) / mean if mean > 0 else 0.0,
              "response_length/p10": float(torch.quantile(lengths, 0.1)),
              "response_length/p90": float(torch.quantile(lengths, 0.9))}
    for name, rows in (("correct", correct), ("wrong", ~correct)):
        if bool(rows.any()):
            spread[f"response_length/{name}_mean"] = float(lengths[rows].mean())
    return spread


class PromptStream:
    """Endless shuffled passes over the training problems; its position is part of a checkpoint."""

    def __init__(self, num_problems: int, *, seed: int, shuffle: bool = True):
        if num_problems < 1:
            raise ValueError("the training set is empty; check data.train and the field names")
        self.num_problems, self.seed, self.shuffle = num_problems, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_problems))
        # modulo 2^63: the product must fit the int64 a generator's seed is read as, whatever the epoch
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) % 2**63)
        return torch.randperm(self.num_problems, generator=g).tolist()

    def take(self, n: int) -> list[int]:
        out = []
        while len(out) < n:
            if self.position >= self.num_problems:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(self._order[self.position])
            self.position += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "shuffle": self.shuffle,
                "num_problems": self.num_problems}

    def load_state_dict(self, state: dict) -> None:
        if state["num_problems"] != self.num_problems:
            raise ValueError(f"checkpoint was taken on {state['num_problems']} training problems but the data "
                             f"now has {self.num_problems}; resume with the same data.train")
        self.seed, self.shuffle = state["seed"], state["shuffle"]
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._permutation(self.epoch)


@dataclass
class _Round:
    problem_index: list[int]     # one per sequence
    prompt_ids: list[list[int]]
    generation: object
    responses: list[str]
    scores_B: torch.Tensor
    correct_B: torch.Tensor
    rewards_B: torch.Tensor
    group_B: torch.Tensor
    keep_B: torch.Tensor
    reward_metrics: dict
    seconds: dict


def _row_extras(rounds: list[_Round], index: dict[int, tuple[torch.Tensor, torch.Tensor]], rows: int
                ) -> tuple[dict, object]:
    """The generations' per-token extras for the kept rows (`index`: per round, (batch rows, its rows)), each
    padded to the widest round (−1 for integer extras such as routes, 0 for floats); and the forward record when
    every row comes from one round (a round's record does not cover another round's rows)."""
    gens = {r: rounds[r].generation for r in index}
    keys = set.intersection(*(set(gen.extras) for gen in gens.values())) if gens else set()
    extras = {}
    for key in sorted(keys):
        pieces = {r: gens[r].extras[key][round_I] for r, (_, round_I) in index.items()}
        first = next(iter(pieces.values()))
        width = max(piece.shape[1] for piece in pieces.values()) if first.dim() > 1 else None
        fill = -1 if not (first.dtype.is_floating_point or first.dtype == torch.bool) else 0
        shape = (rows, width, *first.shape[2:]) if width is not None else (rows, *first.shape[1:])
        out = torch.full(shape, fill, dtype=first.dtype)
        for r, (out_I, _) in index.items():
            if width is None:
                out[out_I] = pieces[r]
            else:
                out[out_I, :pieces[r].shape[1]] = pieces[r]
        extras[key] = out
    record = None
    if len(index) == 1:
        r, (_, round_I) = next(iter(index.items()))
        record = slice_rows(gens[r].forward_record, round_I)
    return extras, record


class Collector:
    """Builds `RolloutBatch`es of `prompts_per_step` groups of `group_size` samples."""

    def __init__(self, *, engine: Engine, problems: Sequence[dict], prompt_ids: Callable[[int], list[int]],
                 decode: Callable[[list[int]], str], rewards, objective, sampling: SamplingParams,
                 prompts_per_step: int, group_size: int, max_rounds: int, stream: PromptStream, pad_id: int):
        self.engine, self.problems, self.prompt_ids, self.decode = engine, problems, prompt_ids, decode
        self.rewards, self.objective, self.sampling = rewards, objective, sampling
        self.P, self.G, self.max_rounds, self.stream, self.pad_id = (prompts_per_step, group_size, max_rounds,
                                                                    stream, pad_id)
        self._next_group_id = 0
        self._tiers = tier_labels(problems)
        self._dropped_on_resume = 0
        self.on_progress: Callable[[str], None] | None = None    # where a long resampling step reports (console)

    # ------------------------------------------------------------------------------------ the loop's bookkeeping
    def position(self) -> dict:
        """Where the next batch starts (cheap): what `rewind` returns to when a step fails before it trained."""
        return self.stream.state_dict()

    def rewind(self, position: dict) -> None:
        self.stream.load_state_dict(position)

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the rollout side: the prompt stream's position."""
        return {"stream": self.stream.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Resume from a checkpoint's state. Batches an asynchronous run had in flight
        (`literl.rollout.async_rollout`) are older than this synchronous loop allows: they are dropped (counted in
        the next step's `async/dropped_rows`) and the stream continues after them."""
        self.stream.load_state_dict(state["stream"])
        in_flight = (state.get("rollouts_in_flight") or {}).get("batches", [])
        self._dropped_on_resume = sum(len(b["batch"]["responses"]) for b in in_flight)

    def collect(self, rng: torch.Generator, *, stop: Callable[[], bool] | None = None
                ) -> tuple[RolloutBatch, dict[str, float]]:
        """One batch; `stop` (the trainer's stop request) is checked between rounds and raises `StepStopped`."""
        rounds: list[_Round] = []
        kept_groups, empty_in_a_row = 0, 0
        started = last_report = time.monotonic()
        while kept_groups < self.P and len(rounds) < self.max_rounds:
            if rounds and stop is not None and stop():
                raise StepStopped(f"stopped while resampling, after {len(rounds)} rounds")
            rnd = self._sample_round(self.P - kept_groups, rng)
            rounds.append(rnd)
            kept_now = len(torch.unique(rnd.group_B[rnd.keep_B]))
            kept_groups += kept_now
            empty_in_a_row = 0 if kept_now else empty_in_a_row + 1
            if empty_in_a_row >= STALL_ROUNDS and len(rounds) < self.max_rounds:
                if kept_groups:
                    break       # the filter can be met, just rarely now: train on the groups kept so far
                sampled = sum(len(torch.unique(r.group_B)) for r in rounds[-STALL_ROUNDS:])
                raise GroupFilterStalled(
                    f"the group filter kept none of the {sampled} groups sampled in the last {STALL_ROUNDS} rounds "
                    f"(rollout.max_rounds={self.max_rounds}): it looks like a rule no group can meet, and the step "
                    f"would resample without end. Check algorithm.group_filter.params against the reward's range "
                    f"(reward/mean, reward/std in metrics.jsonl), or lower rollout.max_rounds to skip such steps")
            now = time.monotonic()
            if self.on_progress is not None and now - last_report >= PROGRESS_SECONDS \
                    and kept_groups < self.P and len(rounds) < self.max_rounds:
                last_report = now
                self.on_progress(f"resampling for {now - started:.0f} s: round {len(rounds)} of at most "
                                 f"{self.max_rounds}, {kept_groups} of {self.P} groups kept so far (the group filter "
                                 f"dropped the rest; Ctrl-C stops after this round)")
        batch = self._assemble(rounds)
        metrics = self._metrics(rounds, batch)
        if self._dropped_on_resume:
            metrics["async/dropped_rows"], self._dropped_on_resume = float(self._dropped_on_resume), 0
        return batch, metrics

    def _sample_round(self, num_prompts: int, rng: torch.Generator) -> _Round:
        chosen = self.stream.take(num_prompts)
        problem_index = [i for i in chosen for _ in range(self.G)]
        prompt_ids = [self.prompt_ids(i) for i in problem_index]
        start = time.perf_counter()
        generation = self.engine.generate(prompt_ids, self.sampling, rng=rng)
        generated = time.perf_counter()
        responses = [self.decode(ids[m].tolist()) for ids, m in zip(generation.response_ids_BT, generation.mask_BT)]
        examples = [self.problems[i] for i in problem_index]
        scores_B, correct_B, reward_metrics = self.rewards.score(responses, examples)
        seconds = {"generate": generated - start, "reward": time.perf_counter() - generated}
        lengths_B = generation.mask_BT.sum(-1)
        rewards_B = self.objective.shape_rewards(scores_B, lengths_B, generation.truncated_B)
        group_B = torch.arange(self._next_group_id, self._next_group_id + num_prompts).repeat_interleave(self.G)
        self._next_group_id += num_prompts
        keep_B = self.objective.keep_groups(correct_B, rewards_B, group_B)
        return _Round(problem_index, prompt_ids, generation, responses, scores_B, correct_B, rewards_B, group_B,
                      keep_B, reward_metrics, seconds)

    def _assemble(self, rounds: list[_Round]) -> RolloutBatch:
        rows = []   # (round, row) of kept sequences, whole groups, at most P groups
        groups_taken: set[int] = set()
        for r_i, rnd in enumerate(rounds):
            for b in range(len(rnd.problem_index)):
                gid = int(rnd.group_B[b])
                if not bool(rnd.keep_B[b]):
                    continue
                if gid not in groups_taken and len(groups_taken) >= self.P:
                    continue
                groups_taken.add(gid)
                rows.append((r_i, b))
        T = max((int(rounds[r].generation.mask_BT.shape[1]) for r in range(len(rounds))), default=1)
        B = len(rows)
        # A round's rows are copied with one indexing op per field (copying row by row cost ~5 ms a batch).
        by_round: dict[int, tuple[list[int], list[int]]] = {}
        for i, (r, b) in enumerate(rows):
            out_rows, round_rows = by_round.setdefault(r, ([], []))
            out_rows.append(i)
            round_rows.append(b)
        index = {r: (torch.tensor(out_rows), torch.tensor(round_rows))
                 for r, (out_rows, round_rows) in by_round.items()}

        def pick(get) -> torch.Tensor:
            """get(round) → its per-row tensor, gathered for the kept rows in batch order."""
            if not rows:
                return get(rounds[0])[:0] if rounds else torch.zeros(0)
            first = get(rounds[rows[0][0]])
            out = first.new_empty((B, *first.shape[1:]))
            for r, (out_I, round_I) in index.items():
                out[out_I] = get(rounds[r])[round_I]
            return out

        extras, forward_record = _row_extras(rounds, index, B)
        response_ids_BT = torch.full((B, T), self.pad_id, dtype=torch.long)
        mask_BT = torch.zeros((B, T), dtype=torch.bool)
        rollout_logp_BT = torch.zeros((B, T), dtype=torch.float32)
        for r, (out_I, round_I) in index.items():
            gen = rounds[r].generation
            width = gen.mask_BT.shape[1]
            response_ids_BT[out_I, :width] = gen.response_ids_BT[round_I]
            mask_BT[out_I, :width] = gen.mask_BT[round_I]
            rollout_logp_BT[out_I, :width] = gen.rollout_logp_BT[round_I]
        prompts = [rounds[r].prompt_ids[b] for r, b in rows]
        prompt_len_B = torch.tensor([len(prompt) for prompt in prompts], dtype=torch.long)
        L = int((prompt_len_B + mask_BT.sum(-1)).max()) if rows else 1
        tokens_BL = torch.full((B, L), self.pad_id, dtype=torch.long)
        prompt_tensors: dict[tuple[int, ...], torch.Tensor] = {}     # a group's rows share their prompt
        for i, prompt in enumerate(prompts):
            key = tuple(prompt)
            if key not in prompt_tensors:
                prompt_tensors[key] = torch.tensor(key, dtype=torch.long)
            tokens_BL[i, :len(key)] = prompt_tensors[key]
        # Each response right after its prompt (a generation's mask is a prefix of its row: up to its EOS).
        row_BT = torch.arange(B)[:, None].expand(B, T)
        column_BT = prompt_len_B[:, None] + torch.arange(T)[None, :]
        tokens_BL[row_BT[mask_BT], column_BT[mask_BT]] = response_ids_BT[mask_BT]

        return RolloutBatch(
            tokens_BL=tokens_BL,
            prompt_len_B=prompt_len_B,
            response_ids_BT=response_ids_BT, mask_BT=mask_BT, rollout_logp_BT=rollout_logp_BT,
            truncated_B=pick(lambda rnd: rnd.generation.truncated_B),
            group_B=pick(lambda rnd: rnd.group_B), scores_B=pick(lambda rnd: rnd.scores_B),
            correct_B=pick(lambda rnd: rnd.correct_B), rewards_B=pick(lambda rnd: rnd.rewards_B),
            problem_B=torch.tensor([rounds[r].problem_index[b] for r, b in rows], dtype=torch.long),
            responses=[rounds[r].responses[b] for r, b in rows],
            problems=[self.problems[rounds[r].problem_index[b]] for r, b in rows],
            extras=extras, forward_record=forward_record, pad_id=self.pad_id)

    def _metrics(self, rounds: list[_Round], batch: RolloutBatch) -> dict[str, float]:
        """Policy statistics over every sampled response (before filtering), plus the filter's effect."""
        cat = lambda name: torch.cat([getattr(r, name) for r in rounds])  # noqa: E731
        correct, rewards, scores, group, keep = (cat("correct_B"), cat("rewards_B"), cat("scores_B"),
                                                 cat("group_B"), cat("keep_B"))
        lengths = torch.cat([r.generation.mask_BT.sum(-1) for r in rounds]).float()
        truncated = torch.cat([r.generation.truncated_B for r in rounds]).float()
        mean_c, _, _ = group_mean_std(correct.float(), group)
        _, std_reward, _ = group_mean_std(rewards, group)
        first = torch.ones_like(group, dtype=torch.bool)
        first[1:] = group[1:] != group[:-1]   # one row per group (groups are contiguous within a round)
        n_groups = int(first.sum())
        group_std = std_reward[first]
        metrics = {
            "accuracy": float(correct.float().mean()),
            "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
            "score/mean": float(scores.mean()),
            "response_length/mean": float(lengths.mean()), "response_length/min": float(lengths.min()),
            "response_length/max": float(lengths.max()), **_length_spread(lengths, correct),
            "truncation_rate": float(truncated.mean()),
            "groups/zero_std_frac": float((group_std == 0).float().mean()),
            # Groups a std normalisation amplifies more than 10x (graded rewards; binary ones at G = 8 have
            # std >= 0.33 unless 0): algorithms.md §1.1, finding_c.
            "groups/small_std_frac": float(((group_std > 0) & (group_std < SMALL_GROUP_STD)).float().mean()),
            "groups/reward_std_mean": float(group_std.mean()),
            "groups/all_correct_frac": float((mean_c[first] == 1).float().mean()),
            "groups/all_wrong_frac": float((mean_c[first] == 0).float().mean()),
            "collect/rounds": float(len(rounds)),
            "collect/sampled_groups": float(n_groups),
            "collect/kept_group_frac": float(keep[first].float().mean()),
            "collect/batch_fill": len(torch.unique(batch.group_B)) / self.P if len(batch) else 0.0,
            "collect/generated_tokens": float(lengths.sum()),
            "time/generate": sum(r.seconds["generate"] for r in rounds),
            "time/reward": sum(r.seconds["reward"] for r in rounds),
        }
        if truncated.any():
            # The cut responses overlong filtering acts on: in a group with no correct response a cut one's advantage
            # is 0 with or without the filter (finding_d's second version: 1.3% of them sat beside a correct one).
            # Logged only at steps that cut something, as the repetition fractions are.
            beside_correct = (mean_c > 0).float()
            metrics["truncation/beside_correct_frac"] = float((truncated * beside_correct).sum() / truncated.sum())
        tiers = [self._tiers[i] for r in rounds for i in r.problem_index]
        for tier in sorted(set(tiers) - {""}, key=_tier_order):
            in_tier = torch.tensor([t == tier for t in tiers]) & first
            metrics[f"groups/reward_std/{tier}"] = float(std_reward[in_tier].mean())
        sizes = [len(r.problem_index) for r in rounds]
        for key in rounds[0].reward_metrics:
            values = [float(r.reward_metrics[key]) for r in rounds]
            # counts (timeouts, errors) add up over rounds; means are weighted by each round's size
            metrics[key] = (sum(v * n for v, n in zip(values, sizes)) / sum(sizes) if key.endswith("mean")
                            else sum(values))
        return metrics
