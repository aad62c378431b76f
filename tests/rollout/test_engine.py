"""NativeEngine: reported log-probs, stopping, row independence, seeding, lower-precision copies, MoE, fallback."""

from __future__ import annotations

import pytest
import torch

from literl.rollout.engine import SamplingParams
from literl.rollout.native_engine import NativeEngine
from tests.conftest import build_tiny_qwen3, tiny_qwen3_moe_config

EOS = 1
PAD = 0
# Ten EOS ids make a random tiny model end most responses within 64 tokens, so stops and row drops happen.
MANY_EOS = [EOS] + list(range(40, 49))


def _prompts(groups=((5, 3), (2, 2), (9, 3)), seed=0):
    """Prompts of different lengths, each repeated as a group of G consecutive rows: (length, G) pairs."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for length, group_size in groups:
        out += [torch.randint(3, 40, (length,), generator=g).tolist()] * group_size
    return out


def _full_forward_logp(model, prompt, response_ids, temperature):
    """log softmax(logits / T) of each response token, from one forward over prompt + response."""
    ids_1L = torch.tensor([list(prompt) + list(response_ids)])
    with torch.no_grad():
        logits_LV = model(input_ids=ids_1L).logits[0].float()
    logp_LV = torch.log_softmax(logits_LV / temperature, dim=-1)
    positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(response_ids))
    return logp_LV[positions, torch.tensor(response_ids)]


def _engine(model, decode, **kwargs):
    kwargs.setdefault("eos_token_ids", MANY_EOS)
    return NativeEngine(model, pad_id=PAD, decode=decode, **kwargs)


@pytest.mark.parametrize("decode", ["static", "fixed", "dynamic"])
def test_rollout_logp_equals_full_forward(decode):
    model = build_tiny_qwen3(seed=0)
    prompts = _prompts()
    params = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=24)
    gen = _engine(model, decode).generate(prompts, params, rng=torch.Generator().manual_seed(0))
    assert gen.mask_BT.any(-1).all()
    for b, prompt in enumerate(prompts):
        n = int(gen.mask_BT[b].sum())
        expected = _full_forward_logp(model, prompt, gen.response_ids_BT[b, :n].tolist(), params.temperature)
        torch.testing.assert_close(gen.rollout_logp_BT[b, :n], expected, rtol=0, atol=1e-5)
        assert (gen.rollout_logp_BT[b, n:] == 0).all()


@pytest.mark.parametrize("decode", ["static", "fixed", "dynamic"])
def test_eos_stops_a_row_and_sets_mask_and_truncation(decode):
    model = build_tiny_qwen3(seed=1)
    T = 16
    gen = _engine(model, decode).generate(_prompts(seed=1) * 4, SamplingParams(max_new_tokens=T),
                                          rng=torch.Generator().manual_seed(1))
    lengths_B = gen.mask_BT.sum(-1)
    assert (~gen.truncated_B).any() and gen.truncated_B.any(), "the test needs both kinds of rows"
    for b in range(len(lengths_B)):
        n = int(lengths_B[b])
        row = gen.response_ids_BT[b].tolist()
        assert gen.mask_BT[b, :n].all() and not gen.mask_BT[b, n:].any()        # mask is a prefix
        assert all(t not in MANY_EOS for t in row[:n - 1])                       # no EOS before the end
        assert all(t == PAD for t in row[n:])
        if gen.truncated_B[b]:
            assert n == T and row[-1] not in MANY_EOS
        else:
            assert row[n - 1] in MANY_EOS                                         # EOS is part of the response


@pytest.mark.parametrize("decode", ["static", "fixed", "dynamic"])
def test_rows_do_not_depend_on_batch_mates(decode):
    """Greedy output for each prompt alone equals its output in a mixed batch of other prompt lengths."""
    model = build_tiny_qwen3(seed=2)
    engine = _engine(model, decode, eos_token_ids=[EOS])
    prompts = _prompts(groups=((3, 1), (11, 1), (6, 1), (1, 1)), seed=2)
    params = SamplingParams(greedy=True, max_new_tokens=20)
    mixed = engine.generate(prompts, params)
    for b, prompt in enumerate(prompts):
        alone = engine.generate([prompt], params)
        assert alone.response_ids_BT[0].tolist() == mixed.response_ids_BT[b].tolist()
        torch.testing.assert_close(alone.rollout_logp_BT[0], mixed.rollout_logp_BT[b], rtol=0, atol=1e-5)


def test_static_and_dynamic_paths_agree_with_row_drops_and_sparse_syncs():
    """Seeded sampling gives the same responses whichever decode path runs and however often rows are dropped."""
    model = build_tiny_qwen3(seed=3)
    prompts = _prompts(seed=3) * 3
    params = SamplingParams(max_new_tokens=32)
    reference = _engine(model, "dynamic").generate(prompts, params, rng=torch.Generator().manual_seed(3))
    assert (~reference.truncated_B).sum() >= 8, "rows must end early for rows to be dropped"
    for decode, sync_every in (("static", 1), ("static", 5), ("dynamic", 3), ("static", 100), ("fixed", 1),
                               ("fixed", 5)):
        gen = _engine(model, decode, sync_every=sync_every).generate(prompts, params,
                                                                     rng=torch.Generator().manual_seed(3))
        assert torch.equal(gen.response_ids_BT, reference.response_ids_BT)
        assert torch.equal(gen.mask_BT, reference.mask_BT) and torch.equal(gen.truncated_B, reference.truncated_B)
        torch.testing.assert_close(gen.rollout_logp_BT, reference.rollout_logp_BT, rtol=0, atol=1e-5)


@pytest.mark.parametrize("decode", ["static", "fixed", "dynamic"])
def test_seeded_rng_repeats_exactly(decode):
    engine = _engine(build_tiny_qwen3(seed=4), decode)
    prompts, params = _prompts(seed=4), SamplingParams(max_new_tokens=16)
    a = engine.generate(prompts, params, rng=torch.Generator().manual_seed(7))
    b = engine.generate(prompts, params, rng=torch.Generator().manual_seed(7))
    c = engine.generate(prompts, params, rng=torch.Generator().manual_seed(8))
    assert torch.equal(a.response_ids_BT, b.response_ids_BT) and torch.equal(a.rollout_logp_BT, b.rollout_logp_BT)
    assert not torch.equal(a.response_ids_BT, c.response_ids_BT)
    # samples of one group differ from each other (the shared prefill does not share randomness)
    assert len({tuple(r) for r in a.response_ids_BT[:5].tolist()}) > 1


def test_bf16_copy_has_real_mismatch_and_follows_sync_weights():
    policy = build_tiny_qwen3(seed=5)
    engine = _engine(policy, "auto", dtype=torch.bfloat16)
    assert engine.model is not policy and next(engine.model.parameters()).dtype == torch.bfloat16
    assert engine.uses_static_kv
    prompts, params = _prompts(seed=5), SamplingParams(max_new_tokens=16)
    gen = engine.generate(prompts, params, rng=torch.Generator().manual_seed(0))
    gaps = []
    for b, prompt in enumerate(prompts):
        n = int(gen.mask_BT[b].sum())
        expected = _full_forward_logp(policy, prompt, gen.response_ids_BT[b, :n].tolist(), 1.0)
        gaps.append((gen.rollout_logp_BT[b, :n] - expected).abs())
    gap = torch.cat(gaps)
    assert 0 < gap.max() < 0.5 and gap.mean() > 1e-4     # bf16 rounding: a real, small mismatch

    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    stale = dict(engine.model.named_parameters())["model.layers.0.mlp.up_proj.weight"].clone()
    engine.sync_weights(policy)
    for (name, mine), theirs in zip(engine.model.named_parameters(), policy.parameters()):
        assert torch.equal(mine, theirs.to(torch.bfloat16)), name
    assert not torch.equal(stale, dict(engine.model.named_parameters())["model.layers.0.mlp.up_proj.weight"])


@pytest.mark.parametrize("decode", ["auto", "dynamic"])
def test_tiny_moe(decode):
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(6)
    model = Qwen3MoeForCausalLM(tiny_qwen3_moe_config())
    engine = _engine(model, decode)
    assert engine.uses_static_kv == (decode == "auto")
    prompts, params = _prompts(seed=6), SamplingParams(temperature=1.3, max_new_tokens=20)
    gen = engine.generate(prompts, params, rng=torch.Generator().manual_seed(0))
    for b, prompt in enumerate(prompts):
        n = int(gen.mask_BT[b].sum())
        expected = _full_forward_logp(model, prompt, gen.response_ids_BT[b, :n].tolist(), params.temperature)
        torch.testing.assert_close(gen.rollout_logp_BT[b, :n], expected, rtol=0, atol=1e-5)


def test_unsupported_model_falls_back_to_its_own_forward():
    """A model whose forward rescales the embeddings fails the static step's check: decode uses its forward."""
    from transformers import Qwen3ForCausalLM

    from tests.conftest import tiny_qwen3_config

    class ScaledEmbeddings(Qwen3ForCausalLM):
        def forward(self, input_ids=None, **kwargs):
            return super().forward(inputs_embeds=self.model.embed_tokens(input_ids) * 2.0, **kwargs)

    torch.manual_seed(7)
    model = ScaledEmbeddings(tiny_qwen3_config())
    engine = _engine(model, "auto")
    assert not engine.uses_static_kv
    with pytest.raises(ValueError):
        _ = _engine(model, "static").uses_static_kv
    prompts, params = _prompts(seed=7), SamplingParams(max_new_tokens=12)
    gen = engine.generate(prompts, params, rng=torch.Generator().manual_seed(0))
    for b, prompt in enumerate(prompts):
        n = int(gen.mask_BT[b].sum())
        expected = _full_forward_logp(model, prompt, gen.response_ids_BT[b, :n].tolist(), 1.0)
        torch.testing.assert_close(gen.rollout_logp_BT[b, :n], expected, rtol=0, atol=1e-5)


def test_training_mode_is_restored_and_empty_batch():
    model = build_tiny_qwen3(seed=8).train()
    engine = _engine(model, "auto")
    engine.generate(_prompts(seed=8), SamplingParams(max_new_tokens=4))
    assert model.training
    empty = engine.generate([], SamplingParams(max_new_tokens=4))
    assert empty.response_ids_BT.shape[0] == 0
    with pytest.raises(ValueError):
        engine.generate([[]], SamplingParams(max_new_tokens=4))


@pytest.mark.slow
def test_compiled_static_step_matches_eager():
    """Same tokens and log-probs as the eager step; one compiled graph of the decode step serves every batch size,
    a batch of one row included (it runs eagerly rather than making dynamo specialise on it), beside the prompts'
    pass."""
    from torch._dynamo.utils import counters

    model = build_tiny_qwen3(seed=9)
    params = SamplingParams(greedy=True, max_new_tokens=24)
    counters.clear()
    compiled_engine = _engine(model, "static", compile=True)
    for prompts in (_prompts(seed=9) * 2, _prompts(seed=9) * 2, _prompts(seed=9)[:1], _prompts(seed=10)):
        eager = _engine(model, "static").generate(prompts, params)
        compiled = compiled_engine.generate(prompts, params)
        assert torch.equal(compiled.response_ids_BT, eager.response_ids_BT)
        torch.testing.assert_close(compiled.rollout_logp_BT, eager.rollout_logp_BT, rtol=0, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 2      # the decode step, the prompts' pass


@pytest.mark.slow
def test_compiled_step_samples_inside_its_graph_like_the_eager_step():
    """With temperature, top-k and top-p, the compiled step (which samples inside its graph from the engine's uniform
    draw) gives the eager static step's and the model's own forward's tokens, rows dropped as they finish."""
    model = build_tiny_qwen3(seed=11)
    prompts = _prompts(seed=11) * 2
    params = SamplingParams(max_new_tokens=24, temperature=0.8, top_k=20, top_p=0.95)
    reference = _engine(model, "dynamic").generate(prompts, params, rng=torch.Generator().manual_seed(5))
    assert (~reference.truncated_B).sum() >= 4, "rows must end early for rows to be dropped"
    for engine in (_engine(model, "static"), _engine(model, "static", compile=True)):
        gen = engine.generate(prompts, params, rng=torch.Generator().manual_seed(5))
        assert torch.equal(gen.response_ids_BT, reference.response_ids_BT)
        torch.testing.assert_close(gen.rollout_logp_BT, reference.rollout_logp_BT, rtol=0, atol=1e-5)


@pytest.mark.parametrize("compiled", [False, True])
def test_prefill_through_hand_applied_prompt_layers_matches_the_models_forward(monkeypatch, compiled):
    """The prefill through the runtime's prompt pass (`prompts.prefill_by_layers`, what the engine runs for a
    model whose layers the runtime runs) samples the same tokens with the same log-probs as the prefill through
    the model's own forward (what it runs otherwise), on prompts of several lengths (left padding) with rows
    dropping as they finish."""
    from literl.model import capabilities as capabilities_module, prompts as model_prompts

    calls = []
    by_layers = model_prompts.prefill_by_layers
    monkeypatch.setattr("literl.rollout.native_engine.prefill_by_layers",
                        lambda *args, **kwargs: calls.append(kwargs["compiled"]) or by_layers(*args, **kwargs))
    model = build_tiny_qwen3(seed=4)
    prompts = _prompts(seed=4) * 2
    params = SamplingParams(temperature=1.0, max_new_tokens=20)
    hand = _engine(model, "static", compile=compiled).generate(prompts, params, rng=torch.Generator().manual_seed(3))
    assert calls == [compiled]
    monkeypatch.setattr(capabilities_module.Capabilities, "shared_prompts", property(lambda self: False))
    default = _engine(model, "static").generate(prompts, params, rng=torch.Generator().manual_seed(3))
    assert calls == [compiled], "the model's own forward prefilled"
    assert not default.mask_BT.all()        # some rows finished early
    assert torch.equal(hand.response_ids_BT, default.response_ids_BT)
    torch.testing.assert_close(hand.rollout_logp_BT, default.rollout_logp_BT, rtol=0, atol=1e-5)


def _tiny_mistral(window: int):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=1, head_dim=16, intermediate_size=64, sliding_window=window,
                           pad_token_id=PAD)
    return MistralForCausalLM(config).eval()


def test_sequences_longer_than_a_sliding_window_decode_through_the_models_forward():
    """A window of 16: the static step passes its short probe, but 10 prompt + 12 new tokens outgrow the window,
    where the static step (which attends to every column) would be wrong by ~1e-2."""
    model = _tiny_mistral(window=16)
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14]] * 2 + [[9, 10]] * 2
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    engine = _engine(model, "auto", eos_token_ids=[EOS])
    gen = engine.generate(prompts, params, rng=torch.Generator().manual_seed(0))
    assert engine.uses_static_kv        # the model itself is supported; only these lengths are not
    assert int(gen.mask_BT.sum(-1).max()) > 6
    for b, prompt in enumerate(prompts):
        n = int(gen.mask_BT[b].sum())
        expected = _full_forward_logp(model, prompt, gen.response_ids_BT[b, :n].tolist(), params.temperature)
        torch.testing.assert_close(gen.rollout_logp_BT[b, :n], expected, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="sliding attention window of 16"):
        _engine(model, "static", eos_token_ids=[EOS]).generate(prompts, params)


def test_attention_window_reads_each_family_config():
    from transformers import Gemma3TextConfig, Qwen2Config, Qwen3Config

    from literl.model.capabilities import attention_window, capabilities

    class Holder(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config

    assert attention_window(Holder(Qwen3Config())) is None
    assert attention_window(Holder(Qwen2Config(use_sliding_window=True, sliding_window=6, max_window_layers=0))) == 6
    assert attention_window(Holder(Gemma3TextConfig(sliding_window=512))) == 512
    assert attention_window(_tiny_mistral(window=16)) == 16
    assert capabilities(_tiny_mistral(window=16)).fits_window(15)
    assert not capabilities(_tiny_mistral(window=16)).fits_window(16)


def test_live_slots_in_place_fills_holes_from_the_end():
    """Hand-computed: live = [1,0,1,1,0,1,1] → K = 5; holes at 1 and 4 among the first five; the live slots 5
    and 6 fill them, every other live slot keeps its position."""
    from literl.rollout.decode_loop import live_slots_in_place

    live = torch.tensor([1, 0, 1, 1, 0, 1, 1], dtype=torch.bool)
    assert live_slots_in_place(live).tolist() == [0, 5, 2, 3, 6]
    assert live_slots_in_place(torch.tensor([1, 1, 0, 0], dtype=torch.bool)).tolist() == [0, 1]   # nothing moves
    assert live_slots_in_place(torch.tensor([0, 0, 0, 1], dtype=torch.bool)).tolist() == [3]
    assert live_slots_in_place(torch.zeros(3, dtype=torch.bool)).tolist() == []


@torch.inference_mode()
def test_static_decoder_keeps_slots_in_any_order():
    """After keep(slots) in an arbitrary order (rows moved forward, backward, and left in place), each slot's
    next logits are those of the row it now holds in a decoder that dropped nothing."""
    from literl.model.decode import StaticKVDecoder
    from literl.model.prompt_pass import distinct_prompts, prefill

    model = build_tiny_qwen3(seed=11).eval()
    prompts = _prompts(seed=11)                      # 8 rows, 3 distinct prompts of lengths 5, 2, 9
    prepared = distinct_prompts(prompts, PAD, torch.device("cpu"))
    g = torch.Generator().manual_seed(11)
    tokens = [torch.randint(3, 40, (len(prompts),), generator=g) for _ in range(4)]
    full, kept = (StaticKVDecoder(model, prefill(model, prepared)[1], prepared, max_new_tokens=5) for _ in range(2))
    kept_R = torch.tensor([7, 1, 0, 5, 3])
    for t, token_B in enumerate(tokens):
        full_BV = full.step(token_B)
        if t == 2:
            kept.keep(kept_R)
        kept_RV = kept.step(token_B if t < 2 else token_B[kept_R])
        expected = full_BV if t < 2 else full_BV[kept_R]
        torch.testing.assert_close(kept_RV, expected, rtol=0, atol=1e-5)
