"""Rollout speed on the benchmark workload: 16 prompts × 8 samples, up to 64 new tokens, T = 1.0.

Prints one JSON line. For each engine variant (run round-robin, medians over repeats):
  rollout_s           one 128-response rollout with the model's own EOS (random weights: most rows run long)
  tokens_per_s        generated tokens / rollout_s
  full_rollout_s      128 × 64 tokens with EOS disabled (every row runs to the end)
  ms_per_decode_step  (full_rollout_s − prefill) / 63 decode steps at batch 128
  prefill_ms          the prompt forward (all rows for `reference`, distinct prompts for the engine)
Each also as CPU time (`*_cpu*`): on a shared machine, compare variants by CPU time at --threads 1.
Variants: `auto` (the engine's default), `static` / `fixed` / `dynamic` (its decode routes: `fixed` is the
fixed-shape step, which CUDA captures as graphs and CPU runs as is), `compiled` / `fixed-compiled` (static /
fixed + torch.compile; the first call, compile included, is reported as compile_s), and `reference` (the engine
before this work: every row prefilled, HF forward with DynamicCache, rows dropped at every EOS).

    python benchmarks/engine_speed.py --variants reference,dynamic,static --repeats 7
    python benchmarks/engine_speed.py --variants static,fixed,compiled,fixed-compiled --repeats 7 --threads 1
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import workload  # noqa: E402
from literl.model.prompt_pass import distinct_prompts, prefill  # noqa: E402
from literl.rollout.engine import SamplingParams  # noqa: E402
from literl.rollout.native_engine import NativeEngine  # noqa: E402
from literl.rollout.sampling import sample_next_token  # noqa: E402
from transformers.cache_utils import DynamicCache  # noqa: E402

NO_EOS = [-1]   # an id no token has: every row runs to max_new_tokens


class ReferenceEngine:
    """The engine as it was before (kept only to measure against): all B rows prefilled, the model's forward
    with a DynamicCache, finished rows dropped from the cache at every step that has one."""

    def __init__(self, model, *, eos_token_ids, pad_id):
        self.model, self.eos, self.pad_id = model, torch.tensor(eos_token_ids), pad_id

    @torch.inference_mode()
    def generate(self, prompts, params, *, rng=None):
        B, P, T = len(prompts), max(len(p) for p in prompts), params.max_new_tokens
        ids = torch.full((B, P), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, P), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, P - len(p):], attn[i, P - len(p):] = torch.tensor(p), 1
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        out_ids = torch.full((B, T), self.pad_id, dtype=torch.long)
        cache = DynamicCache()
        logits = self.model(input_ids=ids, attention_mask=attn, position_ids=positions, past_key_values=cache,
                            use_cache=True, logits_to_keep=1).logits[:, -1]
        active, next_pos = torch.arange(B), positions[:, -1] + 1
        for t in range(T):
            token, _ = sample_next_token(logits, params, rng)
            out_ids[active, t] = token
            done = torch.isin(token, self.eos)
            if t == T - 1 or bool(done.all()):
                break
            if bool(done.any()):
                keep = torch.nonzero(~done).flatten()
                cache.batch_select_indices(keep)
                active, token, attn, next_pos = active[keep], token[keep], attn[keep], next_pos[keep]
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
            logits = self.model(input_ids=token[:, None], attention_mask=attn, position_ids=next_pos[:, None],
                                past_key_values=cache, use_cache=True).logits[:, -1]
            next_pos = next_pos + 1
        is_eos = torch.isin(out_ids, self.eos)
        return (is_eos.long().cumsum(-1) - is_eos.long()) == 0      # the response mask


def _engine(variant: str, model, eos: list[int], pad_id: int, dtype):
    if variant == "reference":
        return ReferenceEngine(model, eos_token_ids=eos, pad_id=pad_id)
    decode = {"auto": "auto", "static": "static", "fixed": "fixed", "dynamic": "dynamic", "compiled": "static",
              "fixed-compiled": "fixed"}[variant]
    return NativeEngine(model, eos_token_ids=eos, pad_id=pad_id, dtype=dtype, decode=decode,
                    compile=variant.endswith("compiled"))


def _prefill_seconds(variant, model, prompts, repeats=5) -> tuple[float, float]:
    """Median (wall, CPU) seconds of the prompt forward alone."""
    def run(_):
        with torch.inference_mode():
            if variant == "reference":
                P = max(len(p) for p in prompts)
                ids = torch.tensor([[0] * (P - len(p)) + p for p in prompts])
                attn = (torch.arange(P)[None] >= torch.tensor([P - len(p) for p in prompts])[:, None]).long()
                model(input_ids=ids, attention_mask=attn, past_key_values=DynamicCache(), use_cache=True,
                      logits_to_keep=1)
            else:
                prefill(model, distinct_prompts(prompts, 0, torch.device("cpu")))
    wall, cpu = workload.interleaved_seconds({"prefill": run}, repeats)
    return workload.summary(wall["prefill"])["median"], workload.summary(cpu["prefill"])["median"]


def _measure(names, engines, full_engines, model, prompts, params, repeats) -> dict:
    """Round-robin timings of every variant (rollout and full-length), summarised per variant."""
    compile_s, generated = {}, {n: [] for n in names}
    for name in names:   # warm-up; the first call of the compiled variant includes compilation
        start = time.perf_counter()
        engines[name].generate(prompts, params, rng=torch.Generator().manual_seed(0))
        if name.endswith("compiled"):
            compile_s[name] = time.perf_counter() - start
        full_engines[name].generate(prompts, params, rng=torch.Generator().manual_seed(0))

    def rollout(name):
        def run(r):
            out = engines[name].generate(prompts, params, rng=torch.Generator().manual_seed(r + 1))
            generated[name].append(int(out.mask_BT.sum() if hasattr(out, "mask_BT") else out.sum()))
        return run

    def full(name):
        return lambda r: full_engines[name].generate(prompts, params, rng=torch.Generator().manual_seed(r + 1))

    variants = {key: run for name in names for key, run in ((name, rollout(name)), (name + "/full", full(name)))}
    wall, cpu = workload.interleaved_seconds(variants, repeats)
    median = lambda times, key: workload.summary(times[key])["median"]   # noqa: E731
    steps = params.max_new_tokens - 1
    results = {}
    for name in names:
        prefill_s, prefill_cpu_s = _prefill_seconds(name, model if name == "reference" else engines[name].model,
                                                    prompts)
        tokens = sum(generated[name]) / len(generated[name])
        results[name] = {
            "rollout_s": round(median(wall, name), 4), "rollout_s_min": round(min(wall[name]), 4),
            "rollout_s_max": round(max(wall[name]), 4), "rollout_cpu_s": round(median(cpu, name), 4),
            "tokens_per_s": round(tokens / median(wall, name), 1),
            "mean_response_tokens": round(tokens / len(prompts), 2),
            "full_rollout_s": round(median(wall, name + "/full"), 4),
            "full_rollout_cpu_s": round(median(cpu, name + "/full"), 4),
            "ms_per_decode_step": round((median(wall, name + "/full") - prefill_s) / steps * 1e3, 3),
            "ms_per_decode_step_cpu": round((median(cpu, name + "/full") - prefill_cpu_s) / steps * 1e3, 3),
            "prefill_ms": round(prefill_s * 1e3, 2), "prefill_cpu_ms": round(prefill_cpu_s * 1e3, 2),
        }
        if name in compile_s:
            results[name]["compile_s"] = round(compile_s[name] - median(wall, name), 2)
        if name != "reference":
            results[name]["static_kv"] = engines[name].uses_static_kv
            results[name]["decode_route"] = engines[name].decode_route
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="auto",
                        help="comma list of auto,static,fixed,dynamic,compiled,fixed-compiled,reference")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=workload.TORCH_THREADS)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="rollout precision (bfloat16: the engine's own copy, as rollout.dtype does)")
    args = parser.parse_args(argv)
    workload.set_threads(args.threads)
    model, tokenizer = workload.build_model()
    model.eval()
    prompts = workload.rollout_prompts(tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=workload.MAX_NEW_TOKENS)
    dtype = getattr(torch, args.dtype) if args.dtype != "float32" else None
    eos, pad = [tokenizer.eos_token_id], tokenizer.pad_token_id
    names = args.variants.split(",")
    engines = {n: _engine(n, model, eos, pad, dtype) for n in names}
    full_engines = {n: _engine(n, model, NO_EOS, pad, dtype) for n in names}
    results = _measure(names, engines, full_engines, model, prompts, params, args.repeats)
    head = results[names[0]]
    workload.print_json({
        "benchmark": "engine_speed", "variant": names[0], "rollout_s": head["rollout_s"],
        "ms_per_decode_step": head["ms_per_decode_step"], "tokens_per_s": head["tokens_per_s"],
        "workload": {"prompts": workload.PROMPTS_PER_STEP, "group": workload.GROUP_SIZE,
                     "max_new_tokens": workload.MAX_NEW_TOKENS, "dtype": args.dtype, "repeats": args.repeats},
        "machine": workload.machine(), "variants": results,
    })


if __name__ == "__main__":
    main()
