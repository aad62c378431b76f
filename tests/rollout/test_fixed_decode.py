"""The fixed-shape decode route (`rollout.decode=fixed`; on CUDA captured as CUDA graphs per batch bucket), on CPU:
the same tokens, log-probs, records and MoE routes as the static route for the same seed, with rows leaving at
every check, at bucket boundaries (trash slots padding the batch) and around the warm-up step a capture takes.
The captures themselves need CUDA (tests/rollout/test_cuda_graphs.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from literl.model import capabilities as capabilities_module
from literl.model.cuda_graphs import bucket_for, decode_buckets
from literl.model.decode import FixedShapeDecoder
from literl.model.moe import ROLLOUT_ROUTES, Routing, new_routes
from literl.model.prompt_pass import distinct_prompts, prefill_by_layers
from literl.rollout.decode_loop import SamplingBuffers, sample_tokens
from literl.rollout.engine import SamplingParams
from literl.rollout.native_engine import NativeEngine
from tests.conftest import build_tiny_qwen3, tiny_qwen3_moe_config
from tests.rollout.test_engine import MANY_EOS, PAD, _prompts

CPU = torch.device("cpu")


def _engine(model, decode, **kwargs):
    return NativeEngine(model, eos_token_ids=MANY_EOS, pad_id=PAD, decode=decode, **kwargs)


def _moe(seed=6):
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(tiny_qwen3_moe_config(num_experts=8, norm_topk_prob=True)).eval()


def test_decode_buckets_hand():
    """2^k and 1.5·2^k from 8 up, 1, 2, 4 below, the batch itself first; a batch runs at the smallest that holds
    its running rows."""
    assert decode_buckets(256) == [256, 192, 128, 96, 64, 48, 32, 24, 16, 12, 8, 4, 2, 1]
    assert decode_buckets(100) == [100, 96, 64, 48, 32, 24, 16, 12, 8, 4, 2, 1]
    assert decode_buckets(10) == [10, 8, 4, 2, 1]
    assert decode_buckets(1) == [1]
    assert [bucket_for(n, decode_buckets(100)) for n in (100, 97, 96, 65, 64, 13, 5, 1)] == [100, 100, 96, 96, 64, 16,
                                                                                             8, 1]


def test_auto_takes_static_on_cpu_and_the_fixed_route_is_selectable(monkeypatch):
    model = build_tiny_qwen3(seed=3)
    assert _engine(model, "auto").decode_route == "static"
    assert _engine(model, "fixed").decode_route == "fixed"          # off CUDA: eager (or compiled), no graphs
    assert _engine(model, "dynamic").decode_route == "dynamic"
    monkeypatch.setitem(capabilities_module.AUTO_DECODE_ROUTES, "cpu", "fixed")
    report = _engine(model, "auto").decode_report()
    assert report["route"] == "fixed" and report["graphs"] == [] and report["capture_failure"] is None
    with pytest.raises(ValueError, match="decode must be one of"):
        _engine(model, "graphs")


@pytest.mark.parametrize("sync_every", [1, 3])
def test_fixed_route_samples_the_static_routes_tokens(sync_every):
    """Temperature, top-k and top-p, rows of three prompt lengths finishing at different steps: the fixed step
    (whole cache attended, unwritten columns masked) gives the static step's tokens, and log-probs within float
    rounding."""
    model = build_tiny_qwen3(seed=3)
    prompts = _prompts(seed=3) * 3
    params = SamplingParams(max_new_tokens=32, temperature=0.8, top_k=30, top_p=0.95)
    static = _engine(model, "static").generate(prompts, params, rng=torch.Generator().manual_seed(3))
    assert (~static.truncated_B).sum() >= 8, "rows must end early for rows to leave the batch"
    fixed = _engine(model, "fixed", sync_every=sync_every).generate(prompts, params,
                                                                    rng=torch.Generator().manual_seed(3))
    assert torch.equal(fixed.response_ids_BT, static.response_ids_BT)
    assert torch.equal(fixed.mask_BT, static.mask_BT) and torch.equal(fixed.truncated_B, static.truncated_B)
    torch.testing.assert_close(fixed.rollout_logp_BT, static.rollout_logp_BT, rtol=0, atol=1e-5)


class _EagerGraphs:
    """Stands in for `BucketGraphs` off CUDA, at every step: the warm-up step, undone by the snapshot; the capture
    (it runs no kernel: emulated as the step, undone); the replay (the step). Any device state the snapshot misses,
    and any host state the step changes (a replay would not), changes the tokens or breaks the loop."""

    def __init__(self):
        self.keys: list[tuple[int, int]] = []
        self.failure = None

    def run(self, key, step, snapshot) -> bool:
        self.keys.append(key)
        for _ in ("warm-up", "capture"):
            restore = snapshot()
            step()
            restore()
        step()
        return True


def _fixed_bucketed(model, prompts, params, seed, routing=None):
    """The engine's loop over a FixedShapeDecoder with buckets (trash slots pad the batch) and a warm-up before
    every step, on CPU."""
    B, T = len(prompts), params.max_new_tokens
    prepared = distinct_prompts(prompts, PAD, CPU)
    with torch.inference_mode():
        if routing is not None:
            routes = prepared.routes_at(routing)
            logits_UV, cache = prefill_by_layers(model, prepared, routes=routes)
            prepared.share_prompt_routes(routing.record_BLNK[:B])
        else:
            logits_UV, cache = prefill_by_layers(model, prepared)
        decoder = FixedShapeDecoder(model, width_step=8).start(cache, prepared, T, routing=routing,
                                                               capacity=prepared.width + T + 5)
        buffers = SamplingBuffers(B, T, PAD, MANY_EOS, CPU)
        graphs = _EagerGraphs()
        ids_BT, logp_BT = sample_tokens(decoder, logits_UV[prepared.source_B], params,
                                        torch.Generator().manual_seed(seed), buffers, sync_every=2,
                                        buckets=decode_buckets(B), graphs=graphs)
    return ids_BT, logp_BT, graphs.keys


def test_bucketed_batches_with_trash_slots_and_warm_ups_sample_the_static_routes_tokens():
    """Rows leave only when the running ones fit a smaller bucket (24 rows: 24 → 16 → 12 → 8 → 4 ...), finished
    rows and trash slots keep stepping in between, the attended width grows by 8 columns at a time, and a warm-up
    step undone by the snapshot precedes every step: the tokens are the static route's, and every response column
    up to a row's end is written."""
    model = build_tiny_qwen3(seed=4)
    prompts = _prompts(seed=4) * 3
    params = SamplingParams(max_new_tokens=30, temperature=1.0)
    static = _engine(model, "static").generate(prompts, params, rng=torch.Generator().manual_seed(4))
    assert (~static.truncated_B).sum() >= 12, "rows must end early for the batch to shrink"
    ids_BT, logp_BT, keys = _fixed_bucketed(model, prompts, params, seed=4)
    gen = _engine(model, "static")._generation(ids_BT, logp_BT)
    assert torch.equal(gen.response_ids_BT, static.response_ids_BT)
    torch.testing.assert_close(gen.rollout_logp_BT, static.rollout_logp_BT, rtol=0, atol=1e-5)
    buckets, widths = [key[0] for key in keys], [key[1] for key in keys]
    assert buckets[0] == 24 and len(set(buckets)) >= 3 and all(b in decode_buckets(24) for b in buckets)
    assert buckets == sorted(buckets, reverse=True)
    # Prompts 9 columns wide: the first step writes column 9 and attends over 16, the last over all 9 + 30 - 1 + 5.
    assert widths == sorted(widths) and widths[0] == 16 and widths[-1] == 40 and all(w % 8 == 0 for w in widths[:-1])


def test_moe_routes_recorded_with_trash_slots_equal_the_static_routes():
    """A Qwen3-MoE: the experts recorded for every fed position (prompt and response) by the bucketed fixed loop,
    whose trash slots route into the extra row, equal the static route's."""
    model = _moe()
    prompts = _prompts(seed=6) * 3
    params = SamplingParams(max_new_tokens=24, temperature=1.3)
    static = _engine(model, "static").generate(prompts, params, rng=torch.Generator().manual_seed(2))
    moe = capabilities_module.capabilities(model).moe
    B, width = len(prompts), distinct_prompts(prompts, PAD, CPU).width + params.max_new_tokens
    routing = Routing(record_BLNK=new_routes(B + 1, width + 5, moe.layers, moe.top_k, CPU))
    ids_BT, logp_BT, keys = _fixed_bucketed(model, prompts, params, seed=2, routing=routing)
    gen = _engine(model, "static")._generation(ids_BT, logp_BT)
    assert torch.equal(gen.response_ids_BT, static.response_ids_BT)
    assert len({key[0] for key in keys}) >= 2
    routes_BLNK = routing.record_BLNK[:B, :width]
    expected = static.extras[ROLLOUT_ROUTES]
    # Positions a row fed before it ended: its prompt and its response up to the token before its last.
    fed_BL = expected[..., 0, 0] >= 0
    assert fed_BL.sum() > 0 and torch.equal(routes_BLNK[fed_BL], expected[fed_BL])


def test_fixed_route_records_the_forward_and_moe_routes_like_the_static_route():
    """With a recorder (CPU) the fixed route keeps the same record rows and values as the static route; an MoE
    model's routes ride on the generation the same way."""
    from literl.model.record import Recorder

    model = build_tiny_qwen3(seed=5)
    prompts = _prompts(seed=5) * 2
    params = SamplingParams(max_new_tokens=20)
    got = {}
    for decode in ("static", "fixed"):
        engine = _engine(model, decode, recorder=Recorder(model, max_bytes=1 << 30))
        gen = engine.generate(prompts, dataclasses.replace(params, keep_forward=True),
                              rng=torch.Generator().manual_seed(5))
        record = gen.forward_record
        got[decode] = (gen, record.row_BT.clone(),
                       [[buffer[:record.rows].clone() for buffer in layer] for layer in record.layers])
    assert torch.equal(got["fixed"][0].response_ids_BT, got["static"][0].response_ids_BT)
    assert torch.equal(got["fixed"][1], got["static"][1])
    for fixed_layer, static_layer in zip(got["fixed"][2], got["static"][2]):
        for fixed_buffer, static_buffer in zip(fixed_layer, static_layer):
            torch.testing.assert_close(fixed_buffer, static_buffer, rtol=0, atol=1e-5)

    moe = _moe()
    gens = [_engine(moe, decode).generate(prompts, params, rng=torch.Generator().manual_seed(1))
            for decode in ("static", "fixed")]
    assert torch.equal(gens[1].response_ids_BT, gens[0].response_ids_BT)
    assert torch.equal(gens[1].extras[ROLLOUT_ROUTES], gens[0].extras[ROLLOUT_ROUTES])


@torch.inference_mode()
def test_a_restarted_decoder_reuses_its_buffers_and_matches_a_fresh_one():
    """`start` on buffers that fit (same rows, a narrower generation) refills them in place: the addresses a graph
    captured stay, the previous generation's columns are cleared, and the logits equal a fresh decoder's."""
    model = build_tiny_qwen3(seed=7).eval()
    first, second = _prompts(seed=7, groups=((9, 2), (4, 2))), _prompts(seed=8, groups=((3, 2), (6, 2)))
    reused = FixedShapeDecoder(model)
    prepared = distinct_prompts(first, PAD, CPU)
    reused.start(prefill_by_layers(model, prepared)[1], prepared, 6, capacity=20)
    for token in (5, 6, 7):
        reused.step(torch.full((4,), token))
    addresses = [k.data_ptr() for k in reused.keys_full] + [reused.column_1.data_ptr(), reused.bias_full.data_ptr()]
    prepared = distinct_prompts(second, PAD, CPU)
    assert reused.fits(4, prepared.width + 6)
    reused.start(prefill_by_layers(model, prepared)[1], prepared, 6)
    fresh = FixedShapeDecoder(model).start(prefill_by_layers(model, prepared)[1], prepared, 6)
    assert [k.data_ptr() for k in reused.keys_full] + [reused.column_1.data_ptr(),
                                                       reused.bias_full.data_ptr()] == addresses
    assert reused.capacity == 20 and fresh.capacity == prepared.width + 6
    for token in (8, 9, 10, 11):
        torch.testing.assert_close(reused.step(torch.full((4,), token)), fresh.step(torch.full((4,), token)),
                                   rtol=0, atol=1e-5)


@torch.inference_mode()
def test_fixed_decoder_keeps_slots_in_any_order_and_pads_with_trash_slots():
    """After keep(slots, rows) in an arbitrary order, each kept slot's next logits are those of the row it now
    holds in a decoder that dropped nothing; the padding slots point at the trash row."""
    model = build_tiny_qwen3(seed=11).eval()
    prompts = _prompts(seed=11)                      # 8 rows, 3 distinct prompts of lengths 5, 2, 9
    prepared = distinct_prompts(prompts, PAD, CPU)
    g = torch.Generator().manual_seed(11)
    tokens = [torch.randint(3, 40, (len(prompts),), generator=g) for _ in range(4)]
    full, kept = (FixedShapeDecoder(model).start(prefill_by_layers(model, prepared)[1], prepared, 5)
                  for _ in range(2))
    kept_R = torch.tensor([7, 1, 0, 5])
    for t, token_B in enumerate(tokens):
        full_BV = full.step(token_B)
        if t == 2:
            kept.keep(kept_R, 6)
            assert kept.slot_rows_R.tolist() == [7, 1, 0, 5, 8, 8]
        kept_RV = kept.step(token_B if t < 2 else torch.cat([token_B[kept_R], token_B[:2]]))
        if t < 2:
            torch.testing.assert_close(kept_RV, full_BV, rtol=0, atol=1e-5)
        else:
            torch.testing.assert_close(kept_RV[:4], full_BV[kept_R], rtol=0, atol=1e-5)


def test_a_failed_capture_is_reported_once_and_the_steps_run_eagerly(monkeypatch, capsys):
    """A step that cannot be captured (here: the capture raises as a host sync inside it would): the graphs say
    why, once, and every step from then on runs eagerly, without a second try."""
    from literl.model.cuda_graphs import BucketGraphs

    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    graphs = BucketGraphs(CPU)
    tries, steps = [], []

    def failing_capture(step, snapshot):
        tries.append(1)
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore detail")

    monkeypatch.setattr(graphs, "_capture", failing_capture)
    assert [graphs.run((8, 64), lambda: steps.append(1), lambda: (lambda: None)) for _ in range(3)] == [False] * 3
    assert len(tries) == 1 and len(steps) == 3 and graphs.graphs == {}
    assert graphs.failure == "RuntimeError: CUDA error: operation not permitted when stream is capturing"
    assert capsys.readouterr().err.count("capturing the decode step as a CUDA graph failed") == 1
