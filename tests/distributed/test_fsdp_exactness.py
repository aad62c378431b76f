"""Two FSDP2 trainer ranks (Ray actors, one gloo process group) against one process on the same batch: the
loss, every parameter's gradient, the no-grad log-probs and the weights after the AdamW step agree within 1e-6
(float32), for token-mean aggregation and for sequence-mean aggregation over two mini-batches, each with an odd
number of micro-batches (one rank runs an idle round).

Why they must: `Objective.prepare` divides by the whole optimizer step's count, so each micro-batch's loss is a
plain weighted sum Σ w·ℓ and the step's gradient is the sum of the micro-batch gradients, wherever each was
computed; the ranks' reduce-scatter sums them (FSDP2's mean is turned off). Only the summation order differs."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import build_tiny_qwen3
from literl.algorithm.batch import RolloutBatch
from literl.config.load import load_config, resolve
from literl.model import PolicyForward
from literl.algorithm.objective import Objective
from literl.training.learner import InProcessLearner
from literl.training.optim import build_optimizer

VOCAB = 60


def _batch(seed: int = 0, B: int = 8, G: int = 2) -> RolloutBatch:
    """Rows of uneven prompt and response lengths in the batch layout (prompt, then response, right-padded)."""
    g = torch.Generator().manual_seed(seed)
    prompt_len = torch.randint(2, 6, (B,), generator=g)
    for b in range(0, B, G):                    # a group shares its prompt
        prompt_len[b:b + G] = prompt_len[b]
    lengths = torch.randint(1, 9, (B,), generator=g)
    T, L = int(lengths.max()), int((prompt_len + lengths).max())
    tokens = torch.zeros(B, L, dtype=torch.long)
    response = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        if b % G == 0:
            prompt = torch.randint(3, VOCAB, (int(prompt_len[b]),), generator=g)
        tokens[b, :prompt_len[b]] = prompt
        r = torch.randint(3, VOCAB, (int(lengths[b]),), generator=g)
        response[b, :lengths[b]] = r
        tokens[b, prompt_len[b]:prompt_len[b] + lengths[b]] = r
    mask = torch.arange(T)[None] < lengths[:, None]
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    return RolloutBatch(tokens_BL=tokens, prompt_len_B=prompt_len, response_ids_BT=response, mask_BT=mask,
                        rollout_logp_BT=-torch.rand(B, T, generator=g) * mask, truncated_B=lengths == 8,
                        group_B=torch.arange(B) // G, scores_B=rewards, correct_B=rewards > 0, rewards_B=rewards,
                        problem_B=torch.arange(B) // G, responses=[""] * B, problems=[{}] * B)


@pytest.mark.parametrize("aggregation, minibatches, epochs", [("token_mean", 1, 1), ("seq_mean_token_mean", 2, 1),
                                                              ("token_mean", 1, 2)])
def test_two_fsdp2_ranks_give_the_single_process_loss_gradients_and_weights(ray_cluster, tmp_path, aggregation,
                                                                             minibatches, epochs):
    from literl.distributed.learner import RayLearner

    cfg = resolve(load_config(overrides=[
        f"algorithm.aggregation.name={aggregation}", "algorithm.entropy_coef=0.01", "trainer.micro_batch_tokens=40",
        f"trainer.minibatches={minibatches}", f"trainer.epochs={epochs}", "optim.lr=1e-3", "optim.max_grad_norm=0",
        "cluster.address=local",
        "cluster.trainer_ranks=2", "trainer.replay_max_gib=0"]), external_model=True)
    model = build_tiny_qwen3(vocab_size=VOCAB)
    objective = Objective.from_config(cfg)
    batch = _batch()

    single = copy.deepcopy(model)
    forward = PolicyForward(single, temperature=cfg.rollout.temperature, max_tokens=cfg.trainer.micro_batch_tokens)
    optimizer, scheduler = build_optimizer(cfg, single)
    learner = InProcessLearner(policy=single, policy_forward=forward, reference=None, objective=objective,
                               optimizer=optimizer, scheduler=scheduler, micro_batch_tokens=40, max_grad_norm=0.0,
                               device=torch.device("cpu"))
    ranks = RayLearner(ray_cluster, cfg, policy=copy.deepcopy(model), reference=None, objective=objective,
                       run_dir=tmp_path)
    try:
        old_single, old_ranks = learner.logprobs(batch), ranks.logprobs(batch)
        torch.testing.assert_close(old_ranks, old_single, rtol=0, atol=1e-6)

        train, _ = objective.prepare(batch, old_logp_BT=old_single, minibatches=minibatches, epochs=epochs,
                                     rng=torch.Generator().manual_seed(0))
        micros = [m for mb in train.minibatches()[:minibatches] for m in objective.micro_batches(mb, 40)]
        assert len(micros) % 2 == 1, "an odd number of micro-batches: one rank runs an idle round"

        got, expected = ranks.update(train), learner.update(train)
        for key in ("loss/total", "loss/policy", "loss/entropy_bonus", "entropy/mean", "optim/grad_norm"):
            assert got[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-7), key
        assert got.keys() == expected.keys()

        grads = ranks.wait([rank.full_gradients.remote() for rank in ranks.ranks])[0]
        names = [name for name, p in single.named_parameters() if p.grad is not None]
        assert sorted(grads) == sorted(names) and len(names) == len(list(single.parameters()))
        for name, param in single.named_parameters():      # the last mini-batch's gradient
            torch.testing.assert_close(grads[name], param.grad, rtol=0, atol=1e-6, msg=name)
        after = dict(ranks.policy().named_parameters())
        for name, param in single.named_parameters():
            torch.testing.assert_close(after[name], param, rtol=0, atol=1e-6, msg=name)
            assert not torch.equal(param, dict(model.named_parameters())[name]), f"{name} did not move"
    finally:
        ranks.shutdown()
