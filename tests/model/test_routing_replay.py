"""Mixture-of-experts layers in the runtime, and Routing Replay (algorithms.md §6, §7): routes recorded by the engine
and the old-log-prob pass, replayed exactly, aligned with the log-prob positions, with the router's gradient."""

from __future__ import annotations

import pytest
import torch

from literl.algorithm.batch import RolloutBatch
from literl.model.capabilities import capabilities
from literl.model.moe import OLD_ROUTES, ROLLOUT_ROUTES, Routing, gate_weights, moe_block
from literl.model.policy import PolicyForward
from literl.model.prompt_pass import batch_prompts
from literl.model.quantize import _rounded
from literl.rollout.engine import SamplingParams
from literl.rollout.native_engine import NativeEngine
from tests.conftest import tiny_qwen3_moe_config

EOS = [1] + list(range(40, 49))
PROMPTS = [[5, 6, 7]] * 3 + [[9, 10, 11, 12, 13, 14]] * 3 + [[20, 21]] * 2     # three lengths: left padding


def _qwen3_moe(seed=0, experts=8):
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(tiny_qwen3_moe_config(num_experts=experts, norm_topk_prob=True)).eval()


def _mixtral(seed=0):
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    config = MixtralConfig(vocab_size=100, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_local_experts=6,
                           num_experts_per_tok=2, max_position_embeddings=256, pad_token_id=0, eos_token_id=1,
                           tie_word_embeddings=True, sliding_window=None)
    return MixtralForCausalLM(config).eval()


def _qwen2_moe(seed=0):
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen2MoeConfig(vocab_size=100, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                            shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1, num_experts=4, num_experts_per_tok=2, max_position_embeddings=256,
                            pad_token_id=0, eos_token_id=1, tie_word_embeddings=True, use_sliding_window=False)
    return Qwen2MoeForCausalLM(config).eval()


def _batch(model, engine=None, prompts=PROMPTS, max_new_tokens=12, seed=0) -> RolloutBatch:
    """A generation laid out as a rollout batch (prompt then response per row, right-padded), its extras kept."""
    engine = engine or NativeEngine(model, eos_token_ids=EOS, pad_id=0)
    gen = engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens),
                          rng=torch.Generator().manual_seed(seed))
    B, T = gen.mask_BT.shape
    lengths = [len(p) for p in prompts]
    tokens_BL = torch.zeros(B, max(lengths) + T, dtype=torch.long)
    for b, prompt in enumerate(prompts):
        n = int(gen.mask_BT[b].sum())
        tokens_BL[b, :len(prompt)] = torch.tensor(prompt)
        tokens_BL[b, len(prompt):len(prompt) + n] = gen.response_ids_BT[b, :n]
    zeros = torch.zeros(B)
    return RolloutBatch(tokens_BL=tokens_BL, prompt_len_B=torch.tensor(lengths), response_ids_BT=gen.response_ids_BT,
                        mask_BT=gen.mask_BT, rollout_logp_BT=gen.rollout_logp_BT, truncated_B=gen.truncated_B,
                        group_B=torch.arange(B) // 3, scores_B=zeros, correct_B=zeros.bool(), rewards_B=zeros,
                        problem_B=zeros.long(), responses=[""] * B, problems=[{}] * B, extras=dict(gen.extras))


def _update_logprobs(forward: PolicyForward, batch, rows=None):
    """An update's forward (mini-batch 0) over the batch's rows (all, or a selection as a micro-batch has them)."""
    part = batch.select(torch.arange(len(batch)) if rows is None else rows).trimmed()
    part.minibatch_B = torch.zeros(len(part), dtype=torch.long)
    with torch.no_grad():
        return forward.logprobs(part).logp_BT, part


@pytest.mark.parametrize("build", [_qwen3_moe, _mixtral, _qwen2_moe], ids=["qwen3-moe", "mixtral", "qwen2-moe"])
def test_moe_families_run_through_the_runtime_and_the_engine_records_every_fed_position(build):
    """Each family's MoE blocks pass the runtime's probe; the engine's log-probs equal the model's own forward,
    and its routes cover exactly the fed positions of each row (prompt tokens and every response token but the
    last), with valid, distinct expert ids."""
    model = build()
    caps = capabilities(model)
    assert caps.moe is not None and caps.static_decode and caps.shared_prompts
    batch = _batch(model)
    routes = batch.extras[ROLLOUT_ROUTES]
    assert routes.shape[2:] == (caps.moe.layers, caps.moe.top_k)
    for b in range(len(batch)):
        fed = int(batch.prompt_len_B[b] + batch.mask_BT[b].sum()) - 1
        assert (routes[b, :fed] >= 0).all() and (routes[b, fed:] == -1).all()
        assert (routes[b, :fed] < caps.moe.experts).all()
        assert (routes[b, :fed, :, 0] != routes[b, :fed, :, 1]).all()
    with torch.no_grad():
        logits = model(input_ids=batch.tokens_BL).logits.float()
    for b in range(len(batch)):
        n, p = int(batch.mask_BT[b].sum()), int(batch.prompt_len_B[b])
        expected = torch.log_softmax(logits[b, p - 1:p - 1 + n], -1).gather(-1, batch.response_ids_BT[b, :n, None])[:, 0]
        torch.testing.assert_close(batch.rollout_logp_BT[b, :n], expected, rtol=0, atol=1e-5)


def test_r2_replay_gives_the_recorded_old_logprobs_bit_for_bit_after_the_router_moves():
    """Of 16 experts, expert 7's router row is zero while the old-log-prob pass records (a logit of 0 against 15
    random ones is among the top two with probability 16/2^15: in this batch, never), then 100 times a random row
    (natural routing now picks it for about half the tokens). R2's update forward replays the recorded experts:
    the old log-probs, bit for bit (a renormalising router's replayed weights read only the recorded experts'
    logits, and a matmul's other rows do not change with row 7); natural routing gives other log-probs."""
    model = _qwen3_moe(seed=1, experts=16)
    gates = [layer.mlp.gate.weight for layer in model.model.layers]
    with torch.no_grad():
        for weight in gates:
            weight[7] = 0.0
    batch = _batch(model, seed=1)
    r2 = PolicyForward(model, routing_replay="r2")
    old_logp = r2.batch_logprobs(batch)
    old_routes = batch.extras[OLD_ROUTES]
    assert (old_routes[old_routes >= 0] != 7).all()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for weight in gates:
            weight[7] = 100.0 * torch.randn(weight.shape[1], generator=g)
    replayed, part = _update_logprobs(r2, batch)
    natural, _ = _update_logprobs(PolicyForward(model, routing_replay="none"), batch)
    mask = part.mask_BT
    assert torch.equal(replayed[mask], old_logp[:, :mask.shape[1]][mask])
    assert float((natural - replayed)[mask].abs().max()) > 1e-2
    metrics = r2.take_metrics()
    assert metrics["moe/route_agree_ti"] == 1.0           # θ_old's natural choice was the fp32 engine's
    assert metrics["moe/route_agree_st_mb0"] < 0.8        # θ's natural choice takes expert 7 for about half the tokens


def test_r3_replays_the_engine_routes_and_fp8_inference_lowers_natural_agreement():
    """An FP8-like engine (projection weights rounded to FP8, bf16 compute) routes some tokens elsewhere than the
    fp32 trainer would: natural training–inference agreement falls below 1. R3's forwards replay the engine's
    experts: every expert id the experts module receives, position by position, is the engine's."""
    model = _qwen3_moe(seed=2)
    engine = NativeEngine(model, eos_token_ids=EOS, pad_id=0, dtype=torch.bfloat16, weights="float8_e4m3")
    batch = _batch(model, engine=engine, seed=2)
    r3 = PolicyForward(model, routing_replay="r3")
    r3.batch_logprobs(batch)
    agreement = r3.take_metrics()["moe/route_agree_ti"]
    assert 0.5 < agreement < 1.0
    used = []
    hooks = [layer.mlp.experts.register_forward_pre_hook(lambda module, args: used.append(args[1].clone()))
             for layer in model.model.layers]
    try:
        routing = Routing(replay_BLNK=batch.extras[ROLLOUT_ROUTES])
        part = batch.select(torch.arange(len(batch))).trimmed()
        with torch.no_grad():
            r3.token_logprobs(part.tokens_BL, part.prompt_len_B, part.response_ids_BT.shape[1], mask_BT=part.mask_BT,
                              routing=routing)
    finally:
        for hook in hooks:
            hook.remove()
    # The prompt pass (distinct prompts, left-padded) comes first: at layer 0 its real tokens got the engine's ids
    # for their positions (the responses' alignment is `test_replayed_routes_line_up_with_the_log_prob_positions`).
    assert len(used) >= 2 * len(model.model.layers)
    engine_routes = batch.extras[ROLLOUT_ROUTES]
    replayed_prompt = used[0]              # layer 0 of the prompt pass: [U·X, k]
    prompts = batch_prompts(part.tokens_BL, part.prompt_len_B)
    first = prompts.first_rows_U()
    ids_UXK = replayed_prompt.view(prompts.ids_UX.shape[0], prompts.width, -1)
    for u in range(prompts.ids_UX.shape[0]):
        n = int(prompts.length_U[u])
        assert torch.equal(ids_UXK[u, -n:].sort(-1).values, engine_routes[first[u], :n, 0].long().sort(-1).values)


def test_replayed_routes_line_up_with_the_log_prob_positions():
    """Route at input position p produces the logits of token p + 1: changing one row's replayed experts at the
    position that predicts its response token t0 changes that row's log-probs from t0 on, and nothing before it or
    in any other row; on a selection of rows in another order (as filters and micro-batches make them)."""
    model = _qwen3_moe(seed=3)
    batch = _batch(model, seed=3)
    rows = torch.tensor([7, 3, 0, 5])
    r3 = PolicyForward(model, routing_replay="r3")
    before, part = _update_logprobs(r3, batch, rows)
    b, t0 = 1, 2                     # row 1 of the selection is batch row 3 (the six-token prompt)
    assert int(part.mask_BT[b].sum()) > t0 + 1
    position = int(part.prompt_len_B[b]) - 1 + t0
    routes = batch.extras[ROLLOUT_ROUTES].clone()
    k = routes.shape[-1]
    routes[int(rows[b]), position] = (routes[int(rows[b]), position] + 1 + torch.arange(k, dtype=routes.dtype)) % 8
    changed = batch.select(torch.arange(len(batch)))
    changed.extras = {**changed.extras, ROLLOUT_ROUTES: routes}
    after, _ = _update_logprobs(r3, changed, rows)
    mask = part.mask_BT
    others = torch.ones(len(rows), dtype=torch.bool)
    others[b] = False
    assert torch.equal(after[others][mask[others]], before[others][mask[others]])
    assert torch.equal(after[b, :t0], before[b, :t0])
    assert float((after[b, t0:] - before[b, t0:])[mask[b, t0:]].abs().max()) > 1e-4


def test_a_missing_route_is_an_error_not_natural_routing():
    model = _qwen3_moe(seed=4)
    batch = _batch(model, seed=4)
    routes = batch.extras[ROLLOUT_ROUTES].clone()
    routes[0, 1] = -1                # a prompt token of row 0 lost its route
    batch.extras[ROLLOUT_ROUTES] = routes
    with pytest.raises(ValueError, match="no valid recorded experts"):
        _update_logprobs(PolicyForward(model, routing_replay="r3"), batch)
    del batch.extras[ROLLOUT_ROUTES]
    with pytest.raises(ValueError, match="routing_replay=r3"):
        _update_logprobs(PolicyForward(model, routing_replay="r3"), batch)


def test_the_router_gets_the_gradient_of_a_softmax_restricted_to_the_replayed_experts():
    """A Qwen3-MoE block on three tokens with replayed experts {0, 1}, {2, 3}, {0, 3}: the block's output and the
    router weight's gradient equal a hand-built reference, out = Σ_k softmax(z[ids])_k · expert_k(x) with
    z = x·W_gateᵀ; the gradient is not zero."""
    model = _qwen3_moe(seed=5)
    block = model.model.layers[0].mlp
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 32, generator=g)
    ids = torch.tensor([[0, 1], [2, 3], [0, 3]])
    routing = Routing(replay_BLNK=ids[:, None, None, :].to(torch.int16).transpose(0, 1))   # [1, 3, 1, 2]
    routes = routing.at(torch.zeros(3, dtype=torch.long), torch.arange(3), torch.ones(3, dtype=torch.bool))
    weight = block.gate.weight
    out = moe_block(block, x, routes.layer(0))
    grad_out = torch.randn(3, 32, generator=g)
    got = torch.autograd.grad(out, weight, grad_out)[0]

    def reference(w):
        z = x @ w.t()
        gates = torch.softmax(z.gather(-1, ids), dim=-1)
        experts = block.experts
        rows = []
        for m in range(3):
            total = torch.zeros(32)
            for slot in range(2):
                e = int(ids[m, slot])
                gate_part, up_part = torch.nn.functional.linear(x[m], experts.gate_up_proj[e]).chunk(2)
                total = total + gates[m, slot] * torch.nn.functional.linear(experts.act_fn(gate_part) * up_part,
                                                                             experts.down_proj[e])
            rows.append(total)
        return torch.stack(rows)

    w = weight.detach().clone().requires_grad_()
    expected_out = reference(w)
    expected = torch.autograd.grad(expected_out, w, grad_out)[0]
    torch.testing.assert_close(out.detach(), expected_out.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert float(got.abs().sum()) > 0


def test_gate_weights_hand():
    """z = [ln 1, ln 2, ln 3, ln 4], ids = [1, 3]: restricted softmax [2/6, 4/6]; full softmax at ids [0.2, 0.4]."""
    z = torch.log(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
    ids = torch.tensor([[1, 3]])
    torch.testing.assert_close(gate_weights(z, ids, True), torch.tensor([[1 / 3, 2 / 3]]))
    torch.testing.assert_close(gate_weights(z, ids, False), torch.tensor([[0.2, 0.4]]))


def test_fp8_rounding_hand():
    """One scale per output row, s = max|w| / 448: [224, 3] → s = 0.5, 3/0.5 = 6 is exact in E4M3; [448, 0.3] → s = 1,
    0.3 lies between the E4M3 neighbours 0.28125 and 0.3125 and rounds to 0.3125."""
    w = torch.tensor([[224.0, 3.0], [448.0, 0.3]])
    torch.testing.assert_close(_rounded(w), torch.tensor([[224.0, 3.0], [448.0, 0.3125]]))


def test_a_dense_model_with_routing_replay_is_a_clear_error():
    from tests.conftest import build_tiny_qwen3

    with pytest.raises(ValueError, match="algorithm.routing_replay=r2"):
        PolicyForward(build_tiny_qwen3(), routing_replay="r2")


def test_the_load_balancing_loss_hand():
    """Two tokens, four experts, k = 1, uniform router probabilities (z = 0): P_e = 1/4; both tokens choose expert 0,
    f = [1, 0, 0, 0]: loss = E · Σ f·P = 4 · 1/4 = 1 (the value a collapsed router reaches; uniform use gives
    4 · 4 · (1/4 · 1/4) = 1 too: Switch's loss is 1 at balance and at collapse when P is uniform, and > 1 only when
    the probabilities follow the imbalance)."""
    routing = Routing(balance=True)
    routes = routing.at(torch.zeros(2, dtype=torch.long), torch.arange(2), torch.ones(2, dtype=torch.bool))

    class Gate(torch.nn.Module):
        norm_topk_prob = True

    routes.layer(0).choose(Gate(), torch.zeros(2, 4), torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1))
    torch.testing.assert_close(routing.balance_loss(), torch.tensor(1.0))
    routing = Routing(balance=True)
    routes = routing.at(torch.zeros(2, dtype=torch.long), torch.arange(2), torch.ones(2, dtype=torch.bool))
    z = torch.tensor([[2.0, 0.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]])
    routes.layer(0).choose(Gate(), z, torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1))
    p0 = float(torch.softmax(z[0], -1)[0])
    torch.testing.assert_close(routing.balance_loss(), torch.tensor(4 * p0))
