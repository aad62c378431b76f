"""The packed training route (`literl.model.packing`, `attention.packed`): rows laid out as one token stream on the
CPU, and a forward through the one layer body whose log-probs and gradients equal the unpacked float32 forward's.
The CUDA kernels (varlen, padded SDPA's flash) run in the `gpu` tests; on CPU the padded and document-mask kernels
are checked against the shared-prompt and whole-row forwards every other test trusts."""

from __future__ import annotations

import pytest
import torch

from literl.algorithm.batch import TrainBatch
from literl.model.capabilities import capabilities
from literl.model.packing import pack_rows, unpacked
from literl.model.policy import PolicyForward
from tests.conftest import build_tiny_qwen3, uneven_rows
from tests.model.test_routing_replay import ROLLOUT_ROUTES, _batch as _moe_batch, _qwen3_moe
from tests.model.varlen_stand_in import stand_in_varlen


def test_pack_rows_lays_out_each_row_up_to_its_last_predictor():
    """Rows (prompt | response, pad 0): [5 6 | 7 8 9], [4 | 3], [2 2 | -] (no valid token: left out).
    Row 0 needs its first 2 + 3 − 1 = 4 tokens, row 1 its first 1 + 1 − 1 = 1: the stream is 5 6 7 8 | 4,
    row starts [0, 4, 5], positions 0 1 2 3 | 0. Response token t of row b is predicted at stream index
    start_b + prompt_len_b − 1 + t: row 0's at 1, 2, 3 (targets 7, 8, 9), row 1's at 4 (target 3); their
    log-probs go to b·T + t = 0, 1, 2 and 3."""
    tokens_BL = torch.tensor([[5, 6, 7, 8, 9], [4, 3, 0, 0, 0], [2, 2, 0, 0, 0]])
    valid_BT = torch.tensor([[True, True, True], [True, False, False], [False, False, False]])
    packed = pack_rows(tokens_BL, torch.tensor([2, 1, 2]), valid_BT)
    assert packed.ids_M.tolist() == [5, 6, 7, 8, 4]
    assert packed.position_M.tolist() == [0, 1, 2, 3, 0]
    assert packed.row_M.tolist() == [0, 0, 0, 0, 1]
    assert packed.cu_R1.tolist() == [0, 4, 5] and (packed.rows, packed.width) == (2, 4)
    assert packed.slot_M.tolist() == [0, 1, 2, 3, 4]
    assert packed.predictor_P.tolist() == [1, 2, 3, 4]
    assert packed.target_P.tolist() == [7, 8, 9, 3]
    assert packed.flat_P.tolist() == [0, 1, 2, 3]
    assert unpacked(torch.tensor([1.0, 2.0, 3.0, 4.0]), packed).tolist() == [[1, 2, 3], [4, 0, 0], [0, 0, 0]]


def test_pack_rows_runs_each_shared_prompt_once_and_gives_each_response_its_keys():
    """Rows (prompt | response): [5 6 | 7 8 9], [5 6 | 3], [4 | 2 1]; rows 0 and 1 continue prompt 5 6.
    Segments: prompt 5 6 (stream 0-1), prompt 4 (2), row 0's response inputs 7 8 (3-4, positions 2 3; its last
    token 9 is no input), row 2's 2 (5, position 1); row 1's only token is predicted by its prompt's last token, so
    it has no segment. Keys: 0 1 | 2 | 0 1 3 4 | 2 5, starts [0, 2, 3, 7, 9]. Predictors: row 0's tokens at 1 (the
    shared prompt's last), 3, 4; row 1's at 1; row 2's at 2, 5."""
    tokens_BL = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 3, 0, 0], [4, 2, 1, 0, 0]])
    valid_BT = torch.tensor([[True, True, True], [True, False, False], [True, True, False]])
    packed = pack_rows(tokens_BL, torch.tensor([2, 2, 1]), valid_BT, share_prompts=True)
    assert packed.shares_prompts
    assert packed.ids_M.tolist() == [5, 6, 4, 7, 8, 2]
    assert packed.position_M.tolist() == [0, 1, 0, 2, 3, 1]
    assert packed.row_M.tolist() == [0, 0, 2, 0, 0, 2]
    assert packed.cu_R1.tolist() == [0, 2, 3, 5, 6] and (packed.rows, packed.width) == (4, 2)
    assert packed.key_Y.tolist() == [0, 1, 2, 0, 1, 3, 4, 2, 5] and packed.cu_key_R1.tolist() == [0, 2, 3, 7, 9]
    assert packed.key_width == 4
    # The keys as the varlen route places them: each stream token's own key once, then the prompt copies.
    assert packed.own_slot_M.tolist() == [0, 1, 2, 5, 6, 8]
    assert packed.copy_slot_A.tolist() == [3, 4, 7] and packed.copy_source_A.tolist() == [0, 1, 2]
    assert packed.predictor_P.tolist() == [1, 3, 4, 1, 2, 5]
    assert packed.target_P.tolist() == [7, 8, 9, 3, 2, 1]
    assert packed.flat_P.tolist() == [0, 1, 2, 3, 6, 7]
    # No two rows share a prompt: the whole rows' layout.
    alone = pack_rows(tokens_BL[1:], torch.tensor([2, 1]), valid_BT[1:], share_prompts=True)
    assert not alone.shares_prompts and alone.ids_M.tolist() == [5, 6, 4, 2]


def test_gathered_keys_equal_an_index_select_forward_and_backward():
    """`attention.gathered_keys` (own keys placed once, prompt copies apart: a backward without atomics over every
    key) gives x[key_Y] and, for a weighted sum of it, x's gradient: each prompt key's gradient is the sum over its
    own key and its copies (three rows continuing the prompt 5 6: its tokens' keys each placed once and copied
    twice)."""
    from literl.model.attention import VarlenLayout, gathered_keys

    tokens_BL = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 3, 4, 0], [5, 6, 2, 1, 0]])
    valid_BT = torch.tensor([[True, True, True], [True, True, False], [True, True, False]])
    packed = pack_rows(tokens_BL, torch.tensor([2, 2, 2]), valid_BT, share_prompts=True)
    assert packed.shares_prompts and packed.copy_source_A.tolist() == [0, 1, 0, 1, 0, 1]
    x = torch.randn(packed.tokens, 2, 3, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(packed.key_Y.numel(), 2, 3, dtype=torch.float64)
    got = gathered_keys(x, VarlenLayout.of(packed))
    expected = x.index_select(0, packed.key_Y)
    assert torch.equal(got, expected)
    (grad_got,) = torch.autograd.grad((weights * got).sum(), x)
    (grad_expected,) = torch.autograd.grad((weights * expected).sum(), x)
    torch.testing.assert_close(grad_got, grad_expected, rtol=0, atol=1e-12)


def test_distinct_prompts_are_numbered_by_first_appearance_and_a_prefix_is_its_own_prompt():
    """Rows continuing prompts a, b, a, c, b, where c = a's first two tokens and row 3's next token is a's third
    (so its first three tokens equal a's, its prompt does not): prompts numbered 0, 1, 0, 2, 1 in the order they
    first appear, first rows 0, 1, 3; the same as `prompts.distinct_prompts` on 200 random rows (60 prompts), in
    random order and in runs of 8 (a GRPO batch's order), a prompt's runs not always next to each other."""
    from literl.model.packing import _distinct_prompt_rows
    from literl.model.prompt_pass import distinct_prompts

    tokens_KL = torch.tensor([[4, 5, 6, 9], [7, 8, 1, 2], [4, 5, 6, 3], [4, 5, 6, 6], [7, 8, 2, 2]])
    source_K, first_U = _distinct_prompt_rows(tokens_KL, torch.tensor([3, 2, 3, 2, 2]))
    assert source_K.tolist() == [0, 1, 0, 2, 1] and first_U.tolist() == [0, 1, 3]
    generator = torch.Generator().manual_seed(0)
    prompt_tokens = torch.randint(1, 4, (60, 6), generator=generator)
    prompt_len = torch.randint(1, 7, (60,), generator=generator)
    for pick_K in (torch.randint(0, 60, (200,), generator=generator),
                   torch.randint(0, 60, (25,), generator=generator).repeat_interleave(8)):
        tokens_KL = torch.cat([prompt_tokens[pick_K], torch.randint(1, 4, (200, 3), generator=generator)], dim=1)
        source_K, first_U = _distinct_prompt_rows(tokens_KL, prompt_len[pick_K])
        expected = distinct_prompts([row[:n] for row, n in zip(tokens_KL.tolist(), prompt_len[pick_K].tolist())],
                                    pad_id=0, device=torch.device("cpu"))
        assert len(first_U) <= len(set(pick_K.tolist()))
        assert torch.equal(source_K, expected.source_B) and torch.equal(first_U, expected.first_rows_U())


def test_shared_prompt_keys_move_to_a_device_with_the_rest():
    """`PackedRows.to` moves the keys' positions and starts too (starts int32, as varlen kernels take them); on
    the CPU the rows are returned as they are."""
    tokens_BL = torch.tensor([[5, 6, 7, 8], [5, 6, 3, 0]])
    packed = pack_rows(tokens_BL, torch.tensor([2, 2]), torch.tensor([[True, True], [True, False]]),
                       share_prompts=True)
    assert packed.to(torch.device("cpu")) is packed
    moved = packed.to(torch.device("meta"))
    assert moved.key_Y.device.type == "meta" and moved.copy_slot_A.device.type == "meta"
    assert moved.cu_key_R1.dtype == torch.int32 and moved.cu_R1.dtype == torch.int32
    assert moved.key_Y.shape == packed.key_Y.shape


def test_a_forward_that_shares_prompts_gives_each_row_its_whole_rows_gradients(monkeypatch):
    """float32 on CPU, document-mask kernel: the packed forward shares the prompt of `uneven_rows`' first two rows
    (the second with a single response token, predicted by the shared prompt's last token: its gradient adds to
    the first row's there) and gives the log-probs and gradients of the same rows packed whole."""
    model = build_tiny_qwen3(seed=4, num_attention_heads=2, num_key_value_heads=1)
    rows = uneven_rows()
    forward = PolicyForward(model, packed="document_mask")
    assert forward.shares_packed_prompts
    shared = _values_and_grads(forward, rows)
    monkeypatch.setattr("literl.model.capabilities.SHARED_PACKED_PROMPTS", ())
    whole_forward = PolicyForward(build_tiny_qwen3(seed=4, num_attention_heads=2, num_key_value_heads=1),
                                  packed="document_mask")
    assert not whole_forward.shares_packed_prompts
    whole = _values_and_grads(whole_forward, rows)
    _assert_float32_close(shared, whole, rows[3])


def _values_and_grads(forward: PolicyForward, rows):
    tokens_BL, prompt_len_B, T, mask_BT = rows
    model = forward.model
    model.zero_grad(set_to_none=True)
    logp, entropy = forward.token_logprobs(tokens_BL, prompt_len_B, T, mask_BT=mask_BT, with_entropy=True)
    w = torch.linspace(-1.0, 2.0, mask_BT.numel(), device=logp.device).view(mask_BT.shape) * mask_BT.to(logp.device)
    ((w * logp).sum() + 0.3 * (w * entropy).sum()).backward()
    return logp.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("kernel", ["padded", "document_mask"])
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_packed_forward_equals_the_unpacked_forward_values_and_gradients(kernel, kv_heads):
    """float32 on CPU: the packed forward (whole rows, each attending to itself) against the shared-prompt forward
    and against whole rows through the model's own forward: log-probs, entropies and every parameter's gradient
    within float32 rounding (grouped-query heads and plain multi-head)."""
    model = build_tiny_qwen3(seed=4, num_attention_heads=2, num_key_value_heads=kv_heads)
    rows = uneven_rows()
    mask_BT = rows[3]
    shared = _values_and_grads(PolicyForward(model, packed="off"), rows)
    packed = _values_and_grads(PolicyForward(model, packed=kernel), rows)
    for got, expected in zip(packed[:2], shared[:2]):
        torch.testing.assert_close(got[mask_BT], expected[mask_BT], rtol=0, atol=2e-5)
        assert (got[~mask_BT] == 0).all()
    for name, grad in packed[2].items():
        torch.testing.assert_close(grad, shared[2][name], rtol=1e-4, atol=2e-6, msg=name)
    with torch.no_grad():
        logits = model(input_ids=rows[0]).logits.float()
    for b in range(4):
        n, p = int(mask_BT[b].sum()), int(rows[1][b])
        expected = torch.log_softmax(logits[b, p - 1:p - 1 + n], -1).gather(-1, rows[0][b, p:p + n, None])[:, 0]
        torch.testing.assert_close(packed[0][b, :n], expected, rtol=0, atol=2e-5)


def test_the_cpu_does_not_pack_and_a_forced_kernel_does():
    """`auto` on CPU keeps the measured CPU routes (no packing); naming a kernel packs."""
    model = build_tiny_qwen3()
    assert PolicyForward(model).packed_kernel is None
    assert capabilities(model).packed_kernel(None) is None
    assert PolicyForward(model, packed="padded").packed_kernel == "padded"
    with pytest.raises(ValueError, match="packed must be one of"):
        PolicyForward(model, packed="flash")


def test_r3_routes_replay_in_the_packed_forward_as_in_the_shared_prompt_forward():
    """A tiny Qwen3-MoE: the update's forward with the engine's routes replayed (R3), packed and unpacked, gives
    the same log-probs (float32), and both count the same training–inference agreement."""
    model = _qwen3_moe(seed=2)
    batch = _moe_batch(model, seed=2)
    assert ROLLOUT_ROUTES in batch.extras
    out = {}
    for packed in ("off", "padded"):
        forward = PolicyForward(model, routing_replay="r3", packed=packed)
        part = batch.select(torch.arange(len(batch))).trimmed()
        part.minibatch_B = torch.zeros(len(part), dtype=torch.long)
        with torch.no_grad():
            out[packed] = forward.logprobs(part).logp_BT, forward.take_metrics()
    mask = part.mask_BT
    torch.testing.assert_close(out["padded"][0][mask], out["off"][0][mask], rtol=0, atol=2e-5)
    assert out["padded"][1] == pytest.approx(out["off"][1])


def test_packed_micro_batches_count_real_tokens():
    """Rows of lengths 7, 5, 4, 2 (prompt 1 + response), longest first. A budget of 10 tokens: padded, [7]
    (7·2 > 10), [5, 4] (5·2 = 10; 5·3 > 10), [2]; packed, [7] (7 + 5 > 10), [5, 4] (9; + 2 > 10), [2]. A budget of
    12: padded still [7] (7·2 > 12), [5, 4] (5·3 > 12), [2]; packed [7, 5] (12; + 4 > 12), [4, 2]."""
    responses = [6, 4, 3, 1]
    B, T = 4, 6
    mask_BT = torch.arange(T)[None, :] < torch.tensor(responses)[:, None]
    zeros, rows = torch.zeros(B, T), torch.zeros(B, dtype=torch.long)
    train = TrainBatch(tokens_BL=torch.ones(B, T + 1, dtype=torch.long), prompt_len_B=rows + 1,
                       response_ids_BT=torch.ones(B, T, dtype=torch.long), mask_BT=mask_BT, loss_mask_BT=mask_BT,
                       rollout_logp_BT=zeros, old_logp_BT=None, ref_logp_BT=None, adv_BT=zeros, is_weight_BT=zeros,
                       weight_BT=zeros, minibatch_B=rows, group_B=rows)

    def lengths(micros):
        return [micro.lengths_B.tolist() for micro in micros]

    assert lengths(train.micro_batches(10)) == [[7], [5, 4], [2]]
    assert lengths(train.micro_batches(10, packed=True)) == [[7], [5, 4], [2]]
    assert lengths(train.micro_batches(12)) == [[7], [5, 4], [2]]
    assert lengths(train.micro_batches(12, packed=True)) == [[7, 5], [4, 2]]


def _other_rows(shared: bool = False):
    """Three rows of other lengths than `uneven_rows`' (another stream length, row count and width); `shared`: the
    first and last continue the same prompt (else no two rows do)."""
    tokens_BL = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 0], [4, 3, 12, 13, 14, 15, 16, 17], [2, 2, 18, 19, 0, 0, 0, 0]])
    if shared:
        tokens_BL[2, :2] = tokens_BL[0, :2]
    mask_BT = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    return tokens_BL, torch.tensor([2, 2, 2]), 6, mask_BT


def _assert_float32_close(compiled, eager, mask_BT):
    """A compiled forward's (log-probs, entropies, gradients) against the eager one's: within float32 rounding, and
    0 where no response token is."""
    for got, expected in zip(compiled[:2], eager[:2]):
        torch.testing.assert_close(got[mask_BT], expected[mask_BT], rtol=0, atol=2e-5)
        assert (got[~mask_BT] == 0).all()
    for name, grad in compiled[2].items():
        torch.testing.assert_close(grad, eager[2][name], rtol=1e-4, atol=2e-6, msg=name)


def test_compiled_packed_layers_equal_the_eager_ones_with_one_graph_for_every_stream():
    """`trainer.compile=true` on the packed route (`packing.compiled_packed_layer`): float32 on CPU, log-probs,
    entropies and every gradient within float32 rounding of the eager packed forward, for two streams of different
    lengths and widths; the second stream compiles nothing new (the layer's graphs have symbolic sizes, and the
    attention kernel between them reads the rows' starts and width outside them)."""
    from torch._dynamo.utils import counters

    model = build_tiny_qwen3(seed=4, num_attention_heads=2, num_key_value_heads=1)
    torch._dynamo.reset()
    counters.clear()
    compiled_graphs = []
    for rows in (uneven_rows(), _other_rows()):
        mask_BT = rows[3]
        eager = _values_and_grads(PolicyForward(model, packed="document_mask"), rows)
        compiled = _values_and_grads(PolicyForward(model, packed="document_mask", compile=True), rows)
        _assert_float32_close(compiled, eager, mask_BT)
        compiled_graphs.append(counters["stats"]["unique_graphs"])
    assert compiled_graphs[0] >= 2, "the layer compiled into graphs around the eager attention kernel"
    assert compiled_graphs[1] == compiled_graphs[0], "the second stream recompiled the layer"


def test_compiled_varlen_layers_are_one_graph_each_and_equal_the_eager_ones(monkeypatch):
    """The varlen kernel inside the compiled layer (`packing.compiled_varlen_layer`), with a CPU stand-in operator
    of varlen_attn's kind: log-probs, entropies and gradients within float32 rounding of the eager packed forward
    (the stand-in called between no graphs), for streams of different lengths and widths; each layer is ONE
    graph (the attention traced into it, no graph break), and a second stream with shared prompts, with another
    width and key count, compiles nothing new (the lengths are symbolic ints); a stream whose rows share no prompt
    is the one other graph. The real kernel runs in the gpu test below."""
    from torch._dynamo.utils import counters

    from literl.model import attention

    def stand_in(query, key, value, cu_Q1, cu_key_R1, max_q, max_k, options):
        return stand_in_varlen(query, key, value, cu_Q1, cu_key_R1, options["scale"])

    monkeypatch.setattr(attention, "varlen_kernel", stand_in)
    monkeypatch.setattr("literl.model.capabilities.SHARED_PACKED_PROMPTS", ("varlen", "document_mask"))
    model = build_tiny_qwen3(seed=4, num_attention_heads=2, num_key_value_heads=1)
    torch._dynamo.reset()
    counters.clear()
    graphs = []
    for rows in (uneven_rows(), _other_rows(shared=True), _other_rows()):
        mask_BT = rows[3]
        eager = _values_and_grads(PolicyForward(model, packed="varlen"), rows)
        reference = _values_and_grads(PolicyForward(model, packed="document_mask"), rows)
        compiled = _values_and_grads(PolicyForward(model, packed="varlen", compile=True), rows)
        torch.testing.assert_close(eager[0][mask_BT], reference[0][mask_BT], rtol=0, atol=1e-6)
        _assert_float32_close(compiled, eager, mask_BT)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] == 1, "the layer with its attention is one graph"
    assert graphs[1] == graphs[0], "the second stream recompiled the layer"
    assert graphs[2] == 2, "rows that share no prompt: the graph without the keys' gather"
    # Rows of one prompt token and one response token: a width of 1, which runs eagerly (a size of 1 would be
    # specialised into a graph of its own), with the same values.
    single = (torch.tensor([[5, 6], [7, 8], [9, 10]]), torch.tensor([1, 1, 1]), 1, torch.ones(3, 1, dtype=torch.bool))
    got = _values_and_grads(PolicyForward(model, packed="varlen", compile=True), single)
    expected = _values_and_grads(PolicyForward(model, packed="document_mask"), single)
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-6)
    assert counters["stats"]["unique_graphs"] == graphs[-1], "a width of 1 compiled a graph"


@pytest.mark.gpu
def test_compiled_packed_bf16_update_on_cuda_matches_the_eager_one():
    """On CUDA with the varlen kernel (or padded, where the probe chose it), bfloat16 over float32 masters: the
    compiled packed layers give the eager packed forward's log-probs within bfloat16 rounding and gradients of
    the same direction (cosine > 0.999), for two streams, the second compiling nothing new."""
    from torch._dynamo.utils import counters

    model = build_tiny_qwen3(seed=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                             hidden_size=256).cuda()
    kernel = PolicyForward(model, compute_dtype=torch.bfloat16).packed_kernel
    torch._dynamo.reset()
    counters.clear()
    graphs = []
    for rows in (uneven_rows(), _other_rows(shared=True)):     # both share a prompt: one stream layout
        mask = rows[3].cuda()
        eager = _values_and_grads(PolicyForward(model, packed=kernel, compute_dtype=torch.bfloat16), rows)
        compiled = _values_and_grads(PolicyForward(model, packed=kernel, compute_dtype=torch.bfloat16,
                                                   compile=True), rows)
        torch.testing.assert_close(compiled[0][mask], eager[0][mask], rtol=0, atol=3e-2)
        for name, grad in compiled[2].items():
            assert grad.dtype == torch.float32
            cosine = torch.nn.functional.cosine_similarity(grad.flatten(), eager[2][name].flatten(), dim=0)
            assert cosine > 0.999, name
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[1] == graphs[0], "the second stream recompiled the layer"
    if kernel == "varlen":     # the layer is one graph (the head's two tile graphs are the others)
        assert not counters["graph_break"], f"the varlen kernel broke the layer's graph: {counters['graph_break']}"


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["varlen", "padded"])
def test_packed_bf16_log_probs_on_cuda_match_the_float32_forward(kernel):
    """On CUDA, each packed kernel computing in bfloat16 over float32 master weights: log-probs within bfloat16
    tolerance of the unpacked float32 forward, gradients float32 and close in direction (cosine > 0.99)."""
    model = build_tiny_qwen3(seed=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                             hidden_size=256).cuda()
    rows = uneven_rows()
    reference = _values_and_grads(PolicyForward(model, packed="off"), rows)
    packed = _values_and_grads(PolicyForward(model, packed=kernel, compute_dtype=torch.bfloat16), rows)
    mask = rows[3].cuda()
    torch.testing.assert_close(packed[0][mask], reference[0][mask], rtol=0, atol=5e-2)
    for name, grad in packed[2].items():
        assert grad.dtype == torch.float32
        cosine = torch.nn.functional.cosine_similarity(grad.flatten(), reference[2][name].flatten(), dim=0)
        assert cosine > 0.99, name


@pytest.mark.gpu
def test_varlen_shares_prompts_on_cuda_by_its_probe(monkeypatch):
    """On CUDA the varlen kernel's segments with more keys than queries (a response over its shared prompt) align
    their causal mask at the end, which sharing needs: the probe passes, and bfloat16 log-probs with the prompt
    shared equal those of the rows packed whole within bfloat16 rounding, gradients of the same direction (off by
    default on CUDA, measured not to pay: `capabilities.SHARED_PACKED_PROMPTS`)."""
    model = build_tiny_qwen3(seed=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                             hidden_size=256).cuda()
    rows = uneven_rows()
    monkeypatch.setattr("literl.model.capabilities.SHARED_PACKED_PROMPTS", ("varlen",))
    forward = PolicyForward(model, packed="varlen", compute_dtype=torch.bfloat16)
    assert forward.shares_packed_prompts
    shared = _values_and_grads(forward, rows)
    monkeypatch.setattr("literl.model.capabilities.SHARED_PACKED_PROMPTS", ())
    whole_model = build_tiny_qwen3(seed=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   hidden_size=256).cuda()
    whole = _values_and_grads(PolicyForward(whole_model, packed="varlen", compute_dtype=torch.bfloat16), rows)
    mask = rows[3].cuda()
    torch.testing.assert_close(shared[0][mask], whole[0][mask], rtol=0, atol=3e-2)
    for name, grad in shared[2].items():
        cosine = torch.nn.functional.cosine_similarity(grad.flatten(), whole[2][name].flatten(), dim=0)
        assert cosine > 0.999, name


@pytest.mark.gpu
def test_cuda_takes_the_packed_route_by_its_probe():
    """`auto` on CUDA packs rows with a kernel whose probe matched the model's own forward."""
    model = build_tiny_qwen3(num_attention_heads=4, num_key_value_heads=2, head_dim=64, hidden_size=256).cuda()
    assert PolicyForward(model, compute_dtype=torch.bfloat16).packed_kernel in ("varlen", "padded")


@pytest.mark.parametrize("names, grouped, expected", [
    ({"is_causal"}, True, {"is_causal": True}),                                         # torch 2.9
    ({"window_size", "scale"}, True, {"window_size": (-1, 0), "scale": 0.25}),          # 2.10-2.11
    ({"window_size", "scale", "enable_gqa"}, True, {"window_size": (-1, 0), "scale": 0.25, "enable_gqa": True}),
    ({"window_size", "scale", "enable_gqa"}, False, {"window_size": (-1, 0), "scale": 0.25}),
])
def test_varlen_keywords_follow_the_installed_signature(monkeypatch, names, grouped, expected):
    """varlen_attn's causal and grouped-query keywords changed between torch releases: the call adapts (head dim
    16, scale 1/4 = 1/sqrt(16)); a scale the signature cannot take is refused, which the probe reads as "no"."""
    from literl.model import attention

    monkeypatch.setattr(attention, "_varlen_parameters", lambda: frozenset(names))
    assert attention.varlen_options(0.25, 16, grouped) == expected
    if "scale" not in names:
        with pytest.raises(NotImplementedError, match="no scale argument"):
            attention.varlen_options(0.1, 16, grouped)


def test_this_torchs_varlen_signature_is_understood():
    """The installed torch's own varlen_attn (a CUDA kernel: only its signature is read here)."""
    pytest.importorskip("torch.nn.attention.varlen")
    from literl.model import attention

    options = attention.varlen_options(0.125, 64, grouped=True)
    assert options.get("is_causal") is True or options.get("window_size") == (-1, 0)


def test_packed_rows_move_to_a_device_in_one_copy_with_int32_row_starts():
    """On another device (meta here: shapes and dtypes only) every index keeps its shape, row starts are int32."""
    tokens_BL = torch.tensor([[5, 6, 7, 8, 9], [4, 3, 0, 0, 0]])
    packed = pack_rows(tokens_BL, torch.tensor([2, 1]), torch.tensor([[True, True, True], [True, False, False]]))
    moved = packed.to(torch.device("meta"))
    assert moved.cu_R1.dtype == torch.int32 and moved.cu_R1.device.type == "meta"
    for name in ("ids_M", "position_M", "row_M", "slot_M", "predictor_P", "target_P", "flat_P"):
        assert getattr(moved, name).shape == getattr(packed, name).shape
        assert getattr(moved, name).dtype == torch.long
    assert (moved.rows, moved.width, moved.batch_rows, moved.T) == (packed.rows, packed.width, 2, 3)
