"""One RL step of real-sized Qwen3 bodies on a GPU: literl's rollout against Hugging Face's `generate` on the same
prompts in the same process, the update's model FLOP utilisation, the step time and the peak GPU memory.

    python benchmarks/gpu_step.py            # CUDA: three bodies below, one JSON line each, ≤ 6 min on one H100
    python benchmarks/gpu_step.py --tiny     # tiny bodies in seconds (the default without CUDA; a CI test runs it)

Bodies (random weights from a config, seed 0; nothing is downloaded), each trained as `model.dtype=bfloat16
rollout.dtype=bfloat16` (bf16 compute over fp32 master weights; the engine's own bf16 copy), GRPO on 32 testbed
prompts × 8 samples × ≤ 256 new tokens, temperature 1, full vocabulary, a reward that varies within groups
(the share of digits):

    qwen3-0.6b   hidden 1024, 28 layers, 16/8 heads, head dim 128, FFN 3072, the 100-token character vocabulary
    qwen3-1.7b   hidden 2048, 28 layers, 16/8 heads, head dim 128, FFN 6144, Qwen's 151,936-token vocabulary (tied)
    qwen3-moe    hidden 1024, 16 layers, 16/4 heads, head dim 128, 32 experts of FFN 768, 4 per token, character
                 vocabulary, algorithm.routing_replay=r3 (the engine's routes replayed in the update)

Per body, after `--warmup` untimed steps (probes, `trainer.micro_batch_tokens=auto`'s sizing), medians over
`--steps` steps of:
    rollout_s, rollout_tok_s   literl's engine: generated tokens / its generate() time
    hf_generate_s, hf_tok_s    `model.generate(do_sample=True)` on the engine's own bf16 model, the last timed
                               step's prompts, the same max_new_tokens, temperature 1, top-k 0, top-p 1: the
                               second of two calls (hf_generate_first_call_s: the first, with its one-off costs)
    literl_over_hf             rollout_tok_s / hf_tok_s
    update_s_steps, update_mfu_steps   each timed step's own update seconds and MFU (steps differ in tokens)
    stream_tokens, shared_prompts   the tokens the update's packed stream runs through the layers, and whether
                               it shares each distinct prompt among its rows (`--share-prompts`)
    update_s, update_mfu       the learner's update (forwards, backwards, optimizer step); FLOPs counted as the
                               issue defines them: 6 · N · trained tokens + causal attention (6 · S² · heads ·
                               head dim per layer and row of S tokens), N = the matmul weights a token goes through
                               (active experts only, LM head once, no embedding lookup), against --peak-tflops
                               (989: H100 SXM bf16 dense)
    step_s                     the whole RL step (rollout, rewards, advantages, update, weight sync)
    peak_memory_gib            torch.cuda.max_memory_allocated over the timed steps
    first_step_s               the first (warm-up) step: probes, sizing, graph captures and, with --compile,
                               every compile
    compile_s                  with --compile (`trainer.compile=true rollout.compile=true`) or --compile-update
                               (`trainer.compile=true`: the update's packed layers, the rollout eager in its CUDA
                               graphs): the seconds `torch.compile` took (`literl.model.compiled.compile_seconds()`,
                               summed); else null
    decode                     the engine's `decode_report()`: route, compile seconds by function, the CUDA graphs
                               captured (bucket, width) and their capture seconds, a capture failure if any
For the first body it also times one forward + backward of the last update's first rows (a micro-batch's worth)
with each packed attention kernel (`attention_kernel_s`), what `literl.model.capabilities.PACKED_ROUTE`'s order
should be measured by.

With `--profile DIR` (`benchmarks/update_profile.py`) one more step's update runs under `torch.profiler` after the
timed steps (what the update's MFU is lost to): DIR/<body>_update_ops.txt holds the top operators by device time
(CPU time without CUDA) and by host time, DIR/<body>_update_trace.json.gz the timeline (chrome://tracing,
Perfetto; the update's parts are the ranges `literl/forward`, `literl/loss`, `literl/backward`, `literl/observe`,
... of `learner.phase`), and the row gains `update_profile`: the device seconds by kind of kernel (matmul,
attention, norm/elementwise, compiled fused kernels, optimizer, copies, communication, other), the kernels
launched, the host synchronisations (cudaStreamSynchronize, cudaDeviceSynchronize, cudaMemcpy without Async) and
the share of the update's wall time the device was busy.

On the GPU machine (torch and transformers there; carry the few pure-Python packages literl needs,
`benchmarks/gpu_wheels.sh`):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_step.py
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from step_literl import digit_fraction  # noqa: E402
from update_profile import profile_one_update, synchronize  # noqa: E402

H100_BF16_TFLOPS = 989.0
QWEN_VOCAB = 151_936
CHAR_VOCAB = None           # the character tokenizer's own size

BODIES = {
    "qwen3-0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=3072, vocab_size=CHAR_VOCAB),
    "qwen3-1.7b": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=6144, vocab_size=QWEN_VOCAB),
    "qwen3-moe": dict(hidden_size=1024, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4,
                      head_dim=128, intermediate_size=3072, moe_intermediate_size=768, num_experts=32,
                      num_experts_per_tok=4, norm_topk_prob=True, vocab_size=CHAR_VOCAB),
}
TINY = {
    "qwen3-0.6b": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, intermediate_size=128, vocab_size=CHAR_VOCAB),
    "qwen3-1.7b": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, intermediate_size=128, vocab_size=1000),
    "qwen3-moe": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, intermediate_size=128, moe_intermediate_size=32, num_experts=4,
                      num_experts_per_tok=2, norm_topk_prob=True, vocab_size=CHAR_VOCAB),
}
WORKLOAD = dict(prompts=32, group=8, max_new_tokens=256)
TINY_WORKLOAD = dict(prompts=2, group=2, max_new_tokens=8)


def build_body(spec: dict, tokenizer, device: torch.device) -> torch.nn.Module:
    """A Qwen3 (or Qwen3-MoE, when the spec has experts) with random weights, float32, made on `device` directly
    (initialising 1.7 B weights on the host would take longer than the benchmark)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    spec = dict(spec, vocab_size=spec["vocab_size"] or len(tokenizer))
    moe = "num_experts" in spec
    config = (Qwen3MoeConfig if moe else Qwen3Config)(
        **spec, max_position_embeddings=4096, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = (Qwen3MoeForCausalLM if moe else Qwen3ForCausalLM)(config)
    return model.float()


def flop_params(model: torch.nn.Module) -> int:
    """N of the issue's FLOP count: per layer the attention projections and the MLP (a mixture of experts: its
    router and the top-k experts a token goes through), plus the LM head once; no embedding lookup."""
    config = model.config
    total = model.get_output_embeddings().weight.numel()
    for layer in model.get_decoder().layers:
        attn, mlp = layer.self_attn, layer.mlp
        total += sum(p.weight.numel() for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj))
        if hasattr(mlp, "experts"):
            per_expert = 3 * config.hidden_size * config.moe_intermediate_size
            total += mlp.gate.weight.numel() + config.num_experts_per_tok * per_expert
        else:
            total += sum(p.weight.numel() for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
    return total


def update_flops(model: torch.nn.Module, train) -> float:
    """6 · N · trained tokens + causal attention, 6 · S² · heads · head_dim per layer and row (S = prompt +
    response: forward QKᵀ and PV at half the square, backward twice that)."""
    config = model.config
    trained = float(train.loss_mask_BT.sum())
    lengths = (train.prompt_len_B + train.mask_BT.sum(-1)).double()
    attention = 6.0 * float((lengths ** 2).sum()) * config.num_attention_heads * config.head_dim \
        * config.num_hidden_layers
    return 6.0 * flop_params(model) * trained + attention


def hf_generate(model: torch.nn.Module, prompts: list[list[int]], max_new_tokens: int, eos: list[int],
                pad: int) -> tuple[float, int]:
    """(seconds, generated tokens) of Hugging Face's sampling `generate` on left-padded prompts."""
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):], mask[i, width - len(p):] = torch.tensor(p), 1
    ids, mask = ids.to(device), mask.to(device)
    synchronize(device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=max_new_tokens,
                             temperature=1.0, top_k=0, top_p=1.0, eos_token_id=eos, pad_token_id=pad)
    synchronize(device)
    seconds = time.perf_counter() - start
    new = out[:, width:].cpu()
    is_eos = torch.isin(new, torch.tensor(eos))
    generated = int(((is_eos.long().cumsum(-1) - is_eos.long()) == 0).sum())     # up to and with the first EOS
    return seconds, generated


def attention_kernel_seconds(model: torch.nn.Module, train, compute: torch.dtype, max_tokens: int
                             ) -> dict[str, float | str]:
    """One forward + backward of the first rows that fit a micro-batch of `max_tokens` with each packed attention
    kernel (after one warm-up call each): the whole batch at once can pass the memory the update sized itself to."""
    from literl.model import PolicyForward

    out: dict[str, float | str] = {}
    T = train.response_ids_BT.shape[1]
    tokens_B = train.prompt_len_B + train.mask_BT.sum(-1)
    rows = max(1, int((tokens_B.cumsum(0) <= max_tokens).sum()))
    tokens_BL, prompt_len_B, mask_BT = train.tokens_BL[:rows], train.prompt_len_B[:rows], train.mask_BT[:rows]
    for kernel in ("varlen", "padded"):
        forward = PolicyForward(model, compute_dtype=compute, packed=kernel)
        try:
            for attempt in range(2):
                synchronize(forward.device)
                start = time.perf_counter()
                logp, entropy = forward.token_logprobs(tokens_BL, prompt_len_B, T, mask_BT=mask_BT,
                                                       with_entropy=True)
                (logp.sum() + entropy.sum()).backward()
                synchronize(forward.device)
                model.zero_grad(set_to_none=True)
            out[kernel] = round(time.perf_counter() - start, 4)
        except Exception as err:        # a kernel this torch or GPU lacks: say which, measure the others
            out[kernel] = f"{type(err).__name__}: {err}"[:200]
            model.zero_grad(set_to_none=True)
    return out


def run_body(name: str, spec: dict, *, workload: dict, steps: int, warmup: int, device: torch.device,
             attention: str, peak_tflops: float | None, kernels: bool, compile: str | None = None,
             decode: str = "auto", profile_dir: Path | None = None, hf: bool = True) -> dict:
    import literl
    from literl.assembly.builder import build_components
    from literl.model.compiled import compile_seconds
    from literl.model.packing import pack_rows
    from literl.testbed.tasks import train_problems
    from literl.testbed.tokenizer import build_char_tokenizer
    from literl.training.trainer import Trainer

    tokenizer = build_char_tokenizer()
    model = build_body(spec, tokenizer, device)
    params = sum(p.numel() for p in model.parameters())
    tmp = tempfile.TemporaryDirectory(prefix="literl-gpu-step-")
    overrides = [
        "model.profile=testbed", "model.dtype=bfloat16", "rollout.dtype=bfloat16",
        f"rollout.prompts_per_step={workload['prompts']}", f"rollout.group_size={workload['group']}",
        f"rollout.max_new_tokens={workload['max_new_tokens']}", "rollout.temperature=1.0",
        "algorithm.aggregation.name=token_mean", "optim.lr=1e-6", "optim.max_grad_norm=1.0", "trainer.minibatches=1",
        f"trainer.device={device.type}", "trainer.progress=false", "trainer.log_samples=0", "trainer.save_every=0",
        "trainer.save_every_minutes=0", f"trainer.output_dir={tmp.name}/run", "eval.before=false", "eval.every=0",
        f"trainer.packed_attention={attention}", "trainer.threads=1" if device.type == "cpu" else "trainer.threads=4",
        f"rollout.decode={decode}",
    ]
    if compile:     # "all" or "update"
        overrides += ["trainer.compile=true"] + (["rollout.compile=true"] if compile == "all" else [])
    if "num_experts" in spec:
        overrides.append("algorithm.routing_replay=r3")
    cfg = literl.load_config(preset="grpo", overrides=overrides)
    parts = build_components(cfg, model=model, tokenizer=tokenizer, problems=train_problems(workload["prompts"]),
                             reward_fns=[digit_fraction])
    trainer = Trainer(parts)
    seen = _instrument(parts)
    # The MoE body replays its routes (r3), which the packed route reads by batch row: never shared there.
    shared = parts.learner.policy_forward.shares_packed_prompts and "num_experts" not in spec
    # The profiled update is one more step after the timed ones: the profiler's overhead stays out of the medians.
    extra = 1 if profile_dir else 0
    profile_name = f"{name}_shared" if shared else name     # beside the whole-rows profile of the same body
    profiled = profile_one_update(parts, device, profile_dir, profile_name, warmup + steps + 1) if extra else {}
    records, first_step_s = [], None
    compiled_before = sum(compile_seconds().values())
    try:
        for i in range(warmup + steps + extra):
            _reset_peak(device)
            synchronize(device)
            start = time.perf_counter()
            metrics = trainer._train_step()
            synchronize(device)
            step_s = time.perf_counter() - start
            trainer.step += 1
            if i == 0:
                first_step_s = step_s
                print(f"[gpu_step] {name}: first step {step_s:.1f} s", file=sys.stderr, flush=True)
            if i < warmup or i >= warmup + steps:
                continue
            train = seen["train"]
            records.append({
                "step_s": step_s, "rollout_s": seen["generate_s"], "generated_tokens": seen["generated"],
                "update_s": metrics["time/update"], "trained_tokens": float(train.loss_mask_BT.sum()),
                "stream_tokens": float(pack_rows(train.tokens_BL, train.prompt_len_B, train.mask_BT,
                                                 share_prompts=shared).tokens),
                "update_flops": update_flops(model, train), "peak_memory_gib": _peak_gib(device)})
        prompts = seen["prompts"]
        # Twice: HF's first call in a process pays one-off costs per new shape (on cu13 builds cuDNN's SDPA builds
        # an execution plan for every key length: 28.9 s for the 0.6B body's first call on an H200, 8.3 s for the
        # second); the ratio is taken against the second, warm call, as literl's timed steps are warm too.
        hf_cold_s = hf_s = hf_tokens = None
        if hf:
            hf_cold_s, _ = hf_generate(parts.engine.model, prompts, workload["max_new_tokens"],
                                       parts.engine.eos_token_ids, parts.engine.pad_id)
            hf_s, hf_tokens = hf_generate(parts.engine.model, prompts, workload["max_new_tokens"],
                                          parts.engine.eos_token_ids, parts.engine.pad_id)
        kernel_s = (attention_kernel_seconds(model, seen["train"], torch.bfloat16,
                                             parts.learner.policy_forward.max_tokens)
                    if kernels and device.type == "cuda" else None)
        row = {key: statistics.median(r[key] for r in records) for key in records[0]}
        rollout_tok_s = row["generated_tokens"] / row["rollout_s"]
        hf_tok_s = hf_tokens / hf_s if hf else None
        tflops = row["update_flops"] / row["update_s"] / 1e12
        return _rounded({
            "model": name, "device": _device_name(device), "params": params, "flop_params": flop_params(model),
            "prompts": workload["prompts"], "group": workload["group"],
            "max_new_tokens": workload["max_new_tokens"], "steps": steps,
            "step_s": row["step_s"], "rollout_s": row["rollout_s"], "generated_tokens": row["generated_tokens"],
            "rollout_tok_s": rollout_tok_s, "hf_generate_s": hf_s, "hf_generate_first_call_s": hf_cold_s,
            "hf_tokens": hf_tokens, "hf_tok_s": hf_tok_s,
            "literl_over_hf": rollout_tok_s / hf_tok_s if hf else None, "update_s": row["update_s"],
            "trained_tokens": row["trained_tokens"], "stream_tokens": row["stream_tokens"],
            "shared_prompts": shared, "update_tflops": tflops,
            "update_mfu": tflops / peak_tflops if peak_tflops else None,
            "peak_memory_gib": row["peak_memory_gib"], "first_step_s": first_step_s,
            "compiled": compile,
            "compile_s": sum(compile_seconds().values()) - compiled_before if compile else None,
            "decode": parts.engine.decode_report() if hasattr(parts.engine, "decode_report") else None,
            "micro_batch_tokens": parts.learner.policy_forward.max_tokens,
            "packed_attention": parts.learner.policy_forward.packed_kernel, "attention_kernel_s": kernel_s,
            "update_profile": profiled.get("summary"),
            # Each timed step's own figures (steps differ in their tokens): the spread behind the medians.
            "update_s_steps": [round(r["update_s"], 4) for r in records],
            "update_mfu_steps": ([round(r["update_flops"] / r["update_s"] / 1e12 / peak_tflops, 4) for r in records]
                                 if peak_tflops else None),
        })
    finally:
        parts.log.close()
        tmp.cleanup()


def _instrument(parts) -> dict:
    """Keep what a step's parts saw: the engine's prompts, time and generated tokens, the prepared batch."""
    seen: dict = {}
    generate, prepare = parts.engine.generate, parts.objective.prepare

    def timed_generate(prompts, params, **kwargs):
        device = next(parts.engine.model.parameters()).device
        synchronize(device)
        start = time.perf_counter()
        out = generate(prompts, params, **kwargs)
        synchronize(device)
        seen.update(prompts=[list(p) for p in prompts], generate_s=time.perf_counter() - start,
                    generated=float(out.mask_BT.sum()))
        return out

    def keep_prepared(*args, **kwargs):
        train, metrics = prepare(*args, **kwargs)
        seen["train"] = train
        return train, metrics

    parts.engine.generate = timed_generate
    parts.objective.prepare = keep_prepared
    return seen


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20      # the process's peak RSS (KiB → GiB)


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _rounded(row: dict) -> dict:
    """Floats to 4 decimals, and those under 0.01 to 4 significant digits: a tiny body's TFLOP/s (~5e-4 on CPU)
    rounded to 4 decimals reads 0.0 whenever its first update is slow (the tiny-mode test saw it on a busy CPU)."""
    return {key: _round(value) if isinstance(value, float) else value for key, value in row.items()}


def _round(value: float) -> float:
    return float(f"{value:.4g}") if abs(value) < 0.01 else round(value, 4)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny bodies and batch (the default without CUDA)")
    parser.add_argument("--models", default=",".join(BODIES), help=f"comma-separated, of {', '.join(BODIES)}")
    parser.add_argument("--steps", type=int, default=1, help="timed steps per body (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--attention", default="auto", help="trainer.packed_attention for the runs")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help=f"the GPU's dense bf16 peak for the MFU (default on CUDA: {H100_BF16_TFLOPS}, H100 SXM)")
    parser.add_argument("--budget-s", type=float, default=330.0,
                        help="start no further body after this many seconds (the run fits one 6-minute call)")
    parser.add_argument("--no-kernels", action="store_true", help="skip timing each packed attention kernel")
    parser.add_argument("--compile", action="store_true",
                        help="trainer.compile=true rollout.compile=true (compile_s: what torch.compile took)")
    parser.add_argument("--compile-update", action="store_true",
                        help="trainer.compile=true alone: the update's packed layers compiled, the rollout eager")
    parser.add_argument("--decode", default="auto", help="rollout.decode for the runs (auto, static, fixed)")
    parser.add_argument("--no-hf", action="store_true", help="skip Hugging Face generate (its figures: null)")
    parser.add_argument("--share-prompts", action="store_true",
                        help="the varlen kernel's stream shares each distinct prompt among its rows (by default "
                             "whole rows, each with its own copy of its prompt: capabilities.SHARED_PACKED_PROMPTS)")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="profile one more step's update: operator table in DIR, kinds in the row")
    args = parser.parse_args(argv)
    # literl's own sizing and back-off decisions (the micro-batch size `auto` chose, a retried step) on stderr.
    for logger in ("literl.model.capabilities", "literl.training.learner"):
        logging.getLogger(logger).setLevel(logging.INFO)
        if not logging.getLogger(logger).handlers:
            logging.getLogger(logger).addHandler(logging.StreamHandler(sys.stderr))
    if args.share_prompts:
        from literl.model import capabilities

        capabilities.SHARED_PACKED_PROMPTS += ("varlen",)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    tiny = args.tiny or device.type == "cpu"
    peak = args.peak_tflops or (H100_BF16_TFLOPS if device.type == "cuda" else None)
    bodies, workload = (TINY, TINY_WORKLOAD) if tiny else (BODIES, WORKLOAD)
    if device.type == "cpu":
        torch.set_num_threads(1)
    started, rows = time.perf_counter(), []
    for i, name in enumerate(args.models.split(",")):
        if name not in bodies:
            parser.error(f"unknown model {name!r}: choose from {', '.join(bodies)}")
        if time.perf_counter() - started > args.budget_s:
            row = {"model": name, "skipped": f"time budget of {args.budget_s:.0f} s spent"}
        else:
            print(f"[gpu_step] {name} on {_device_name(device)}...", file=sys.stderr, flush=True)
            row = run_body(name, bodies[name], workload=workload, steps=args.steps, warmup=args.warmup,
                           device=device, attention=args.attention, peak_tflops=peak,
                           kernels=i == 0 and not args.no_kernels, decode=args.decode,
                           compile="all" if args.compile else "update" if args.compile_update else None,
                           profile_dir=args.profile, hf=not args.no_hf)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


if __name__ == "__main__":
    main()
