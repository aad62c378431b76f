"""The benchmark workload shared by the speed and memory benchmarks (and, later, the full-step comparison).

Qwen3 from config: hidden 256, 4 layers, 4 heads, 2 KV heads, head dim 64, FFN 768, tied embeddings, fp32,
the character tokenizer's 100-token vocabulary (or a larger vocabulary for the memory benchmark). Prompts are
16 testbed arithmetic problems, each repeated for 8 samples: 128 responses of up to 64 new tokens, T = 1.0.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import time
from typing import Callable

import torch

PROMPTS_PER_STEP = 16
GROUP_SIZE = 8
MAX_NEW_TOKENS = 64
TORCH_THREADS = 2


def build_model(*, vocab_size: int | None = None, seed: int = 0, dtype: torch.dtype = torch.float32):
    """The benchmark Qwen3 (random weights) and its tokenizer; `vocab_size` overrides the tokenizer's 100."""
    from literl.testbed.model import ModelShape, build_model as build_testbed_model, qwen3_config
    from literl.testbed.tokenizer import build_char_tokenizer
    from transformers import Qwen3ForCausalLM

    tokenizer = build_char_tokenizer()
    shape = ModelShape(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, ffn_size=768)
    if vocab_size is None:
        model = build_testbed_model(shape, tokenizer, seed=seed)
    else:
        config = qwen3_config(shape, tokenizer)
        config.vocab_size = vocab_size
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    return model.to(dtype), tokenizer


def rollout_prompts(tokenizer, *, prompts_per_step: int = PROMPTS_PER_STEP, group_size: int = GROUP_SIZE,
                    seed: int = 0) -> list[list[int]]:
    """Testbed problems' token ids, each repeated `group_size` times consecutively (as the collector sends them)."""
    from literl.testbed.measure import prompt_ids
    from literl.testbed.tasks import train_problems

    ids = prompt_ids(tokenizer, train_problems(prompts_per_step, seed=seed))
    return [p for p in ids for _ in range(group_size)]


def set_threads(threads: int = TORCH_THREADS) -> None:
    torch.set_num_threads(threads)


def interleaved_seconds(variants: dict[str, Callable[[int], object]], repeats: int
                        ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(wall, CPU) seconds of each variant, run round-robin (A, B, A, B, ...) so that load from other processes
    hits every variant alike; the callable receives the repeat index (e.g. as a seed). On a shared machine, CPU
    time at 1 thread is the steadier figure for comparing variants; wall time at 2 threads is the headline."""
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(repeats):
        for name, run in variants.items():
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            run(r)
            wall[name].append(time.perf_counter() - start_wall)
            cpu[name].append(time.process_time() - start_cpu)
    return wall, cpu


def summary(seconds: list[float]) -> dict[str, float]:
    return {"median": statistics.median(seconds), "min": min(seconds), "max": max(seconds), "n": len(seconds)}


def machine() -> dict:
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "platform": platform.machine(), "load_avg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def rss_bytes() -> int:
    """This process's resident memory now (Linux /proc; 0 where it is not available)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (ru_maxrss, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def print_json(record: dict) -> None:
    print(json.dumps(record, sort_keys=False))
