"""The rollout's forward record: what it holds, where each token's rows are, and when there is none."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from literl.model.capabilities import capabilities
from literl.model.record import Recorder, record_bytes
from literl.rollout.engine import SamplingParams
from literl.rollout.native_engine import NativeEngine
from tests.conftest import build_tiny_qwen3, tiny_qwen3_moe_config
from tests.rollout.test_engine import EOS, MANY_EOS, PAD, _prompts


def _recording_engine(model, *, max_bytes=2 << 30, **kwargs):
    """An engine lent a recorder for its model (as `PolicyForward` lends its own in a run)."""
    return NativeEngine(model, recorder=Recorder(model, max_bytes), **kwargs)


def _tiny_qwen2(seed=0):
    """Qwen2 has biases on q/k/v: the record must include them."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=64, max_position_embeddings=256, pad_token_id=PAD,
                         tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:     # nonzero biases, so that a missing one would show
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_()
    return model


def _projection_outputs(model, ids_1L):
    """Per layer, the (qkv, o, gate_up, down) outputs of a plain forward at every position, then the attention's
    output (o_proj's input), via hooks."""
    captured: dict[tuple[int, str], torch.Tensor] = {}
    handles = []
    names = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for index, layer in enumerate(model.get_decoder().layers):
        modules = {**{n: getattr(layer.self_attn, n) for n in names[:4]},
                   **{n: getattr(layer.mlp, n) for n in names[4:]}}
        for name, module in modules.items():
            handles.append(module.register_forward_hook(
                lambda mod, args, out, key=(index, name): captured.__setitem__(key, out[0].detach())))
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(
            lambda mod, args, key=(index, "attention"): captured.__setitem__(key, args[0][0].detach())))
    try:
        with torch.no_grad():
            model(input_ids=ids_1L)
    finally:
        for handle in handles:
            handle.remove()
    return [(torch.cat([captured[(i, "q_proj")], captured[(i, "k_proj")], captured[(i, "v_proj")]], -1),
             captured[(i, "o_proj")], torch.cat([captured[(i, "gate_proj")], captured[(i, "up_proj")]], -1),
             captured[(i, "down_proj")], captured[(i, "attention")]) for i in range(len(model.get_decoder().layers))]


@pytest.mark.parametrize("build", [lambda: build_tiny_qwen3(seed=2), lambda: _tiny_qwen2(seed=2)],
                         ids=["qwen3", "qwen2-biases"])
def test_record_holds_each_fed_tokens_projection_outputs(build):
    """Prompts of different lengths, responses ending early (rows dropped from the batch mid-rollout): the record
    row of response token t of row b holds every layer's projection outputs at that position, and (on CPU) the
    attention's output, as the model's own forward computes them."""
    model = build().eval()
    prompts = _prompts(seed=4) * 3
    engine = _recording_engine(model, eos_token_ids=MANY_EOS, pad_id=PAD)
    gen = engine.generate(prompts, SamplingParams(max_new_tokens=20, keep_forward=True),
                          rng=torch.Generator().manual_seed(0))
    record, row_BT = gen.forward_record, gen.forward_record.row_BT
    assert len(record.layers[0]) == 6, "on CPU the record keeps the attention's output and log-sum-exp"
    lengths = gen.mask_BT.sum(-1)
    assert int(lengths.min()) < 20 <= int(lengths.max()), "the batch must shrink while some rows run to the end"
    for b, prompt in enumerate(prompts):
        n = int(lengths[b])
        # Tokens 0 .. n-2 were fed (a finished row may also feed a few tokens past its end until it is dropped);
        # the last column never is.
        assert (row_BT[b, :n - 1] >= 0).all() and row_BT[b, -1] == -1
        if n < 2:
            continue
        ids_1L = torch.tensor([prompt + gen.response_ids_BT[b, :n].tolist()])
        expected = _projection_outputs(model, ids_1L)
        rows = row_BT[b, :n - 1]
        positions = torch.arange(len(prompt), len(prompt) + n - 1)   # response tokens 0 .. n-2 as inputs
        for layer_record, layer_expected in zip(record.layers, expected):
            for got, want in zip(layer_record, layer_expected):
                torch.testing.assert_close(got[rows], want[positions], rtol=0, atol=2e-5)


def test_recording_leaves_the_samples_unchanged():
    model = build_tiny_qwen3(seed=3)
    prompts, params = _prompts(seed=5) * 2, SamplingParams(max_new_tokens=16)
    engine = _recording_engine(model, eos_token_ids=MANY_EOS, pad_id=PAD)
    plain = engine.generate(prompts, params, rng=torch.Generator().manual_seed(1))
    recorded = engine.generate(prompts, dataclasses.replace(params, keep_forward=True),
                               rng=torch.Generator().manual_seed(1))
    assert recorded.forward_record is not None and plain.forward_record is None
    assert torch.equal(recorded.response_ids_BT, plain.response_ids_BT)
    torch.testing.assert_close(recorded.rollout_logp_BT, plain.rollout_logp_BT, rtol=0, atol=1e-5)


def test_a_record_is_valid_until_the_next_recording_and_only_for_its_weights():
    """Valid until the recorder's next record; matching only its module, untouched, with no step of the optimizer
    the recorder watches since (as `PolicyForward.watch` has it watch the run's optimizer)."""
    model = build_tiny_qwen3(seed=4)
    engine = _recording_engine(model, eos_token_ids=[EOS], pad_id=PAD)
    params = SamplingParams(max_new_tokens=8)
    first = engine.generate(_prompts(), dataclasses.replace(params, keep_forward=True)).forward_record
    assert first.valid() and first.matches(model)
    assert not first.matches(build_tiny_qwen3(seed=4))          # same weights, another module
    engine.generate(_prompts(), params)                         # a plain generation (evaluation) keeps it
    assert first.valid()
    second = engine.generate(_prompts(), dataclasses.replace(params, keep_forward=True)).forward_record
    assert second.valid() and not first.valid()                # its buffers now hold the second rollout
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1.0                       # an in-place edit
    assert not second.matches(model)
    for fused in (False, True):                                 # a fused step leaves version counters alone
        record = engine.generate(_prompts(), dataclasses.replace(params, keep_forward=True)).forward_record
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
        engine.recorder.watch(optimizer)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        assert record.matches(model)
        optimizer.step()
        assert record.valid() and not record.matches(model)


def test_no_record_where_the_update_could_not_use_one():
    prompts, params = _prompts(), SamplingParams(max_new_tokens=8)
    model = build_tiny_qwen3(seed=5)
    budget = record_bytes(model, len(prompts) * 7)
    cases = {
        "over the memory budget": _recording_engine(model, eos_token_ids=[EOS], pad_id=PAD, max_bytes=budget - 1),
        "an engine copy in another dtype": _recording_engine(model, eos_token_ids=[EOS], pad_id=PAD,
                                                             dtype=torch.bfloat16),
        "the model's own forward": _recording_engine(model, eos_token_ids=[EOS], pad_id=PAD, decode="dynamic"),
        "no recorder lent": NativeEngine(model, eos_token_ids=[EOS], pad_id=PAD),
    }
    for why, engine in cases.items():
        assert engine.generate(prompts, dataclasses.replace(params, keep_forward=True)).forward_record is None, why
    fits = _recording_engine(model, eos_token_ids=[EOS], pad_id=PAD, max_bytes=budget)
    assert fits.generate(prompts, dataclasses.replace(params, keep_forward=True)).forward_record is not None


def test_moe_layers_are_not_recorded():
    """A sparse MoE block is not `down(act(gate) · up)`: no record (Routing Replay is a separate feature)."""
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(tiny_qwen3_moe_config())
    assert not capabilities(model).record
    gen = _recording_engine(model, eos_token_ids=[EOS], pad_id=PAD).generate(
        _prompts(), SamplingParams(max_new_tokens=6, keep_forward=True))
    assert gen.forward_record is None and gen.mask_BT.any()


@pytest.mark.slow
def test_compiled_recording_step_matches_eager():
    """rollout.compile=true: the same tokens, log-probs and record as the eager step, one compiled graph of the
    recording step for every batch size (rows dropped mid-rollout, a last row left alone runs eagerly), beside
    the prompts' pass."""
    from torch._dynamo.utils import counters

    model = build_tiny_qwen3(seed=12)
    params = SamplingParams(greedy=True, max_new_tokens=20)
    counters.clear()
    compiled_engine = _recording_engine(model, eos_token_ids=MANY_EOS, pad_id=PAD, compile=True)
    eager_engine = _recording_engine(model, eos_token_ids=MANY_EOS, pad_id=PAD)
    for prompts in (_prompts(seed=6) * 2, _prompts(seed=7), _prompts(seed=6)[:1]):
        eager = eager_engine.generate(prompts, dataclasses.replace(params, keep_forward=True))
        compiled = compiled_engine.generate(prompts, dataclasses.replace(params, keep_forward=True))
        assert torch.equal(compiled.response_ids_BT, eager.response_ids_BT)
        torch.testing.assert_close(compiled.rollout_logp_BT, eager.rollout_logp_BT, rtol=0, atol=1e-5)
        assert torch.equal(compiled.forward_record.row_BT, eager.forward_record.row_BT)
        rows = compiled.forward_record.rows
        for got_layer, want_layer in zip(compiled.forward_record.layers, eager.forward_record.layers):
            for got, want in zip(got_layer, want_layer):
                torch.testing.assert_close(got[:rows], want[:rows], rtol=0, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 2      # the recording decode step, the prompts' pass
