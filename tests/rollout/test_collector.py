"""Collector._assemble: the batch's rows from several sampling rounds, whole groups, at most P of them."""

from __future__ import annotations

import dataclasses

import torch

from literl.rollout.collector import Collector, _Round
from literl.rollout.engine import Generation, SamplingParams

PAD = 0


def _round(prompts, lengths, width, keep, first_group, seed):
    """A sampling round: `prompts[b]` with a response of `lengths[b]` tokens (EOS = 1 last) in a `width`-wide
    generation; groups of two consecutive rows."""
    g = torch.Generator().manual_seed(seed)
    B = len(prompts)
    ids_BT = torch.full((B, width), PAD, dtype=torch.long)
    mask_BT = torch.zeros(B, width, dtype=torch.bool)
    for b, n in enumerate(lengths):
        ids_BT[b, :n] = torch.randint(3, 50, (n,), generator=g)
        ids_BT[b, n - 1] = 1
        mask_BT[b, :n] = True
    logp_BT = torch.where(mask_BT, -torch.rand(B, width, generator=g), torch.zeros(B, width))
    generation = Generation(ids_BT, mask_BT, logp_BT, torch.tensor([n == width for n in lengths]))
    scores = torch.rand(B, generator=g)
    return _Round(list(range(B)), prompts, generation, [f"r{seed}b{b}" for b in range(B)], scores, scores > 0.5,
                  2 * scores, torch.arange(first_group, first_group + B // 2).repeat_interleave(2),
                  torch.tensor(keep), {}, {})


def test_rows_of_several_rounds_and_widths_are_laid_out_prompt_then_response():
    collector = Collector(engine=None, problems=[{}] * 8, prompt_ids=None, decode=None, rewards=None,
                          objective=None, sampling=SamplingParams(), prompts_per_step=3, group_size=2,
                          max_rounds=2, stream=None, pad_id=PAD)
    rounds = [_round([[5, 6, 7], [5, 6, 7], [8], [8]], [2, 4, 1, 3], width=4, keep=[True, True, False, False],
                     first_group=0, seed=0),
              _round([[9, 9], [9, 9], [4, 3, 2, 2], [4, 3, 2, 2], [7], [7]], [6, 1, 2, 5, 3, 3], width=6,
                     keep=[True, True, True, True, True, True], first_group=2, seed=1)]
    batch = collector._assemble(rounds)
    kept = [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (1, 3)]      # three groups: the first round's, two of the second
    assert batch.tokens_BL.shape[0] == len(kept)
    for i, (r, b) in enumerate(kept):
        prompt, gen = rounds[r].prompt_ids[b], rounds[r].generation
        n = int(gen.mask_BT[b].sum())
        expected = prompt + gen.response_ids_BT[b, :n].tolist()
        assert batch.tokens_BL[i].tolist() == expected + [PAD] * (batch.tokens_BL.shape[1] - len(expected))
        assert int(batch.prompt_len_B[i]) == len(prompt)
        width = gen.mask_BT.shape[1]
        assert batch.response_ids_BT[i].tolist() == gen.response_ids_BT[b].tolist() + [PAD] * (6 - width)
        assert batch.mask_BT[i].tolist() == gen.mask_BT[b].tolist() + [False] * (6 - width)
        assert batch.rollout_logp_BT[i].tolist() == gen.rollout_logp_BT[b].tolist() + [0.0] * (6 - width)
        assert bool(batch.truncated_B[i]) == bool(gen.truncated_B[b]) and batch.responses[i] == rounds[r].responses[b]
        for name in ("group_B", "scores_B", "correct_B", "rewards_B"):
            assert getattr(batch, name)[i] == getattr(rounds[r], name)[b], name
    assert batch.truncated_B.any() and not batch.truncated_B.all()


def test_per_token_extras_of_several_rounds_are_padded_to_the_widest_round():
    """Routes of two rounds of widths 3 + 4 and 4 + 6 (prompt + response positions, 1 layer, top-2): each kept row
    keeps its own routes and is padded with −1 past its round's width; a float extra pads with 0; the forward
    record of one round does not ride on a batch drawn from two."""
    collector = Collector(engine=None, problems=[{}] * 8, prompt_ids=None, decode=None, rewards=None,
                          objective=None, sampling=SamplingParams(), prompts_per_step=3, group_size=2,
                          max_rounds=2, stream=None, pad_id=PAD)
    rounds = [_round([[5, 6, 7], [5, 6, 7], [8], [8]], [2, 4, 1, 3], width=4, keep=[True, True, False, False],
                     first_group=0, seed=0),
              _round([[9, 9], [9, 9], [4, 3, 2, 2], [4, 3, 2, 2]], [6, 1, 2, 5], width=6,
                     keep=[True, True, True, True], first_group=2, seed=1)]
    for r, rnd in enumerate(rounds):
        B, width = len(rnd.prompt_ids), rnd.generation.mask_BT.shape[1]
        L = max(len(p) for p in rnd.prompt_ids) + width
        rnd.generation.extras = {
            "rollout_routes_BLNK": (100 * r + torch.arange(B * L * 2).view(B, L, 1, 2)).to(torch.int16),
            "score_BT": torch.full((B, width), float(r + 1))}
        rnd.generation.forward_record = object()
    batch = collector._assemble(rounds)
    routes, scores = batch.extras["rollout_routes_BLNK"], batch.extras["score_BT"]
    kept = [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert routes.shape == (6, 10, 1, 2) and scores.shape == (6, 6) and batch.forward_record is None
    for i, (r, b) in enumerate(kept):
        own = rounds[r].generation.extras["rollout_routes_BLNK"][b]
        assert torch.equal(routes[i, :own.shape[0]], own) and (routes[i, own.shape[0]:] == -1).all()
        width = rounds[r].generation.mask_BT.shape[1]
        assert (scores[i, :width] == r + 1).all() and (scores[i, width:] == 0).all()


def test_group_metrics_count_zero_and_small_reward_std_apart():
    """Groups of two with rewards (1.0, 1.0): std 0; (1.0, 1.02): unbiased std 0.02/√2 = 0.0141; (0.95, 1.0): 0.0354;
    (1.0, 0.0): 0.707. groups/zero_std_frac = 1/4; groups/small_std_frac (0 < std < 0.1, the groups a std
    normalisation amplifies more than 10×) = 2/4; binary rewards alone never reach it at 0 < std."""
    collector = Collector(engine=None, problems=[{}] * 8, prompt_ids=None, decode=None, rewards=None,
                          objective=None, sampling=SamplingParams(), prompts_per_step=4, group_size=2,
                          max_rounds=1, stream=None, pad_id=PAD)
    rnd = _round([[5]] * 8, [2] * 8, width=3, keep=[True] * 8, first_group=0, seed=0)
    rnd = dataclasses.replace(rnd, rewards_B=torch.tensor([1.0, 1.0, 1.0, 1.02, 0.95, 1.0, 1.0, 0.0]),
                              seconds={"generate": 0.0, "reward": 0.0})
    metrics = collector._metrics([rnd], collector._assemble([rnd]))
    assert metrics["groups/zero_std_frac"] == 0.25
    assert metrics["groups/small_std_frac"] == 0.5


def test_cut_responses_are_counted_beside_a_correct_one_only_when_their_group_has_one():
    """Groups of two, width 3 (a response of 3 tokens is cut). Rows (correct, cut): group 0 (yes, no) (no, yes): the
    cut one sits beside a correct one; group 1 (no, yes) (no, yes): both cut, none correct; group 2 (yes, yes)
    (no, no): the cut one is itself correct; group 3 (no, no) (no, no): nothing cut. 4 cut responses, 2 beside (or
    being) a correct one: truncation/beside_correct_frac = 2/4; with nothing cut the metric is not logged."""
    collector = Collector(engine=None, problems=[{}] * 8, prompt_ids=None, decode=None, rewards=None,
                          objective=None, sampling=SamplingParams(), prompts_per_step=4, group_size=2,
                          max_rounds=1, stream=None, pad_id=PAD)
    rnd = _round([[5]] * 8, [2, 3, 3, 3, 3, 2, 2, 2], width=3, keep=[True] * 8, first_group=0, seed=0)
    correct = torch.tensor([True, False, False, False, True, False, False, False])
    rnd = dataclasses.replace(rnd, correct_B=correct, rewards_B=correct.float(),
                              seconds={"generate": 0.0, "reward": 0.0})
    metrics = collector._metrics([rnd], collector._assemble([rnd]))
    assert metrics["truncation_rate"] == 0.5
    assert metrics["truncation/beside_correct_frac"] == 0.5
    uncut = _round([[5]] * 8, [2] * 8, width=3, keep=[True] * 8, first_group=0, seed=0)
    uncut = dataclasses.replace(uncut, seconds={"generate": 0.0, "reward": 0.0})
    assert "truncation/beside_correct_frac" not in collector._metrics([uncut], collector._assemble([uncut]))
