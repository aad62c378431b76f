"""trainer.micro_batch_tokens=auto sizes micro-batches from the memory a probe measured; when a micro-batch still
runs out of accelerator memory, the optimizer step starts again at 3/4 of the size (in 1024-token steps), and the
run keeps the smaller size. The step's gradient is the sum of its micro-batches' whatever their size, so the
retried step is the step a run at the final size takes: same weights, same metrics. A size the user set is never
changed: its out-of-memory error names the setting and the fix, and no weight has moved.

The device's out-of-memory error is played by the forward (`torch.OutOfMemoryError`, what CUDA raises) when a
test's rule says so: micro-batches over a size, or one micro-batch after others of the step went through (their
metrics and gradients must then be dropped)."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from literl.algorithm.batch import RolloutBatch
from literl.config.load import load_config, resolve
from literl.model import PolicyForward
from literl.algorithm.objective import Objective
from literl.training.learner import InProcessLearner
from literl.training.optim import build_optimizer
from tests.conftest import build_tiny_qwen3

VOCAB, LIMIT = 60, 2200


def _batch(B: int = 240, G: int = 4) -> RolloutBatch:
    """B rows of a 3-token prompt and 4-10 response tokens (≈ 3,100 padded tokens in all)."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(4, 11, (B,), generator=g)
    P, T = 3, int(lengths.max())
    tokens = torch.zeros(B, P + T, dtype=torch.long)
    tokens[:, :P] = torch.randint(3, VOCAB, (B // G, P), generator=g).repeat_interleave(G, 0)
    mask = torch.arange(T)[None] < lengths[:, None]
    response = torch.randint(3, VOCAB, (B, T), generator=g) * mask
    tokens[:, P:] = response
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    return RolloutBatch(tokens_BL=tokens, prompt_len_B=torch.full((B,), P), response_ids_BT=response, mask_BT=mask,
                        rollout_logp_BT=-torch.rand(B, T, generator=g) * mask, truncated_B=lengths == 10,
                        group_B=torch.arange(B) // G, scores_B=rewards, correct_B=rewards > 0, rewards_B=rewards,
                        problem_B=torch.arange(B) // G, responses=[""] * B, problems=[{}] * B)


def _learner(model, micro_batch_tokens, start_tokens: int, fails=lambda sizes: sizes[-1] > LIMIT):
    cfg = resolve(load_config(overrides=["optim.lr=1e-3", "trainer.replay_max_gib=0"]), external_model=True)
    forward = PolicyForward(model, temperature=cfg.rollout.temperature, max_tokens=start_tokens)
    optimizer, scheduler = build_optimizer(cfg, model)
    objective = Objective.from_config(cfg)
    learner = InProcessLearner(policy=model, policy_forward=forward, reference=None, objective=objective,
                               optimizer=optimizer, scheduler=scheduler, micro_batch_tokens=micro_batch_tokens,
                               max_grad_norm=1.0, device=torch.device("cpu"))
    sizes = []
    real_logprobs = forward.logprobs

    def logprobs(micro, **kwargs):
        sizes.append(micro.tokens_BL.numel())
        if fails(sizes):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 622.00 MiB (played by the test)")
        return real_logprobs(micro, **kwargs)

    forward.logprobs = logprobs
    return learner, objective, sizes


def _train(objective, learner, batch):
    train, _ = objective.prepare(batch, old_logp_BT=learner.logprobs(batch), rng=torch.Generator().manual_seed(0))
    return train


def test_an_auto_sized_step_that_runs_out_of_memory_is_retried_smaller_and_equals_the_step_at_that_size(caplog):
    """The batch is 3,120 padded tokens. At 4096 and 3072 tokens its first micro-batch (3,120, then 3,068) is over
    LIMIT: two failures; at 2048 (three quarters of 3072, in 1024-token steps) it splits into 2,041 + 747 tokens
    and fits. The run at 2048 from the start takes the same micro-batches: weights and metrics equal to the bit."""
    model = build_tiny_qwen3(vocab_size=VOCAB)
    batch = _batch()
    backed_off, objective, sizes = _learner(copy.deepcopy(model), "auto", start_tokens=4096)
    direct, _, direct_sizes = _learner(copy.deepcopy(model), 2048, start_tokens=2048)
    train = _train(objective, direct, batch)

    with caplog.at_level(logging.WARNING, logger="literl.training.learner"):
        got = backed_off.update(train)
    expected = direct.update(train)

    assert sizes == [3120, 3068, *direct_sizes] and direct_sizes == [2041, 747]
    assert backed_off.policy_forward.max_tokens == 2048
    warnings = [r.getMessage() for r in caplog.records if "ran out of accelerator memory" in r.getMessage()]
    assert [w.split("starts again at ")[1].split(" ")[0] for w in warnings] == ["3072", "2048"]
    assert got == expected
    for (name, p), q in zip(backed_off.policy().named_parameters(), direct.policy().parameters()):
        assert torch.equal(p, q), name
    assert not all(torch.equal(p, q) for p, q in zip(model.parameters(), direct.policy().parameters()))


def test_a_step_that_fails_after_some_micro_batches_went_through_drops_their_metrics_and_gradients():
    """At 2048 tokens the step's second micro-batch fails once (2,041 tokens went through: forward, backward,
    metrics). The step starts again at 1024 tokens (three quarters of 2048 in 1024-token steps) from nothing: equal
    to the run at 1024, metrics included."""
    model = build_tiny_qwen3(vocab_size=VOCAB)
    batch = _batch()
    backed_off, objective, sizes = _learner(copy.deepcopy(model), "auto", start_tokens=2048,
                                            fails=lambda sizes: len(sizes) == 2)
    direct, _, direct_sizes = _learner(copy.deepcopy(model), 1024, start_tokens=1024, fails=lambda sizes: False)
    train = _train(objective, direct, batch)
    got, expected = backed_off.update(train), direct.update(train)
    assert sizes[:2] == [2041, 747] and sizes[2:] == direct_sizes and len(direct_sizes) >= 2
    assert got == expected
    for (name, p), q in zip(backed_off.policy().named_parameters(), direct.policy().parameters()):
        assert torch.equal(p, q), name


def test_a_size_the_user_set_is_kept_and_its_out_of_memory_error_names_the_setting_and_the_fix():
    model = build_tiny_qwen3(vocab_size=VOCAB)
    before = copy.deepcopy(model)
    learner, objective, sizes = _learner(model, 4096, start_tokens=4096)
    train = _train(objective, learner, _batch())
    with pytest.raises(torch.OutOfMemoryError, match=r"micro_batch_tokens=4096\).*set trainer.micro_batch_tokens "
                                                     r"lower, or to auto.*played by the test"):
        learner.update(train)
    assert len(sizes) == 1 and learner.policy_forward.max_tokens == 4096
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before.parameters())), "no weight moved"


def test_auto_at_its_smallest_size_raises_instead_of_retrying_forever():
    model = build_tiny_qwen3(vocab_size=VOCAB)
    learner, objective, sizes = _learner(model, "auto", start_tokens=1024)
    train = _train(objective, learner, _batch())
    learner.policy_forward.logprobs = lambda micro, **kw: (_ for _ in ()).throw(torch.OutOfMemoryError("full"))
    with pytest.raises(torch.OutOfMemoryError, match=r"at most 1024 tokens .*micro_batch_tokens=auto\).*smaller "
                                                     r"model or rollout batch"):
        learner.update(train)


def test_the_optimizer_step_is_queued_before_the_diagnostics_read_the_token_maps():
    """With fused AdamW the learner queues each optimizer step before `observe` reads anything, so on a GPU the clip
    and the step follow the backward without the device waiting for the host (`learner.step_on_device`); every
    micro-batch of a step is observed after its own step was queued and before the next step's. Two mini-batches."""
    model = build_tiny_qwen3(vocab_size=VOCAB)
    batch = _batch(B=48)
    learner, objective, _ = _learner(model, 4096, start_tokens=4096, fails=lambda sizes: False)
    train, _ = objective.prepare(batch, old_logp_BT=learner.logprobs(batch), minibatches=2,
                                 rng=torch.Generator().manual_seed(0))
    steps_seen = []
    param = next(model.parameters())
    learner.update(train, observe=lambda micro, maps: steps_seen.append(
        int(learner.optimizer.state[param]["step"]) if param in learner.optimizer.state else 0))
    assert steps_seen and sorted(set(steps_seen)) == [1, 2]
