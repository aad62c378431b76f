"""Compile time of the rollout's compiled parts (`rollout.compile=true`: the fixed-shape decode step and the
prompts' pass) against the model's depth, in the two forms literl compiles them in:

  whole     one graph of all the layers (CPU's form: fusion across layer boundaries, one dynamo call per pass)
  by_layer  one graph of a layer that serves every layer (CUDA's form, `compiled.compiles_layer_by_layer`)

Each point runs in a fresh process with an empty inductor cache (a warm cache would hide the compile) and
generates once (8 rows, 8 new tokens) with `decode="fixed", compile=True`; it reports `compile_seconds()` (each
compiled function's first call: compile and one run) and the generation's wall time. Prints one JSON line.

    python benchmarks/compile_speed.py                                  # CPU, the benchmark model's widths
    python benchmarks/compile_speed.py --device cuda --layers 28 --hidden 1024 --heads 16 --kv-heads 8 \\
        --head-dim 128 --ffn 3072 --dtype bfloat16                      # the Qwen3-0.6B body on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _one(args) -> dict:
    """One (form, depth) point, in this process."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    import literl.model.prompt_pass as prompts_module
    import literl.rollout.native_engine as engine_module
    from literl.model.compiled import compile_seconds
    from literl.rollout.engine import SamplingParams

    torch.set_num_threads(args.threads)
    by_layer = args.form == "by_layer"
    engine_module.compiles_layer_by_layer = prompts_module.compiles_layer_by_layer = lambda device_type: by_layer
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=100, hidden_size=args.hidden, num_hidden_layers=args.depth,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
                         intermediate_size=args.ffn, max_position_embeddings=4096, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(config).to(device=args.device, dtype=getattr(torch, args.dtype)).eval()
    engine = engine_module.NativeEngine(model, eos_token_ids=[1], pad_id=0, decode="fixed", compile=True)
    prompts = [[3 + (i * 7 + j) % 90 for j in range(5 + i % 4)] for i in range(8)]
    start = time.perf_counter()
    engine.generate(prompts, SamplingParams(max_new_tokens=8), rng=torch.Generator().manual_seed(0))
    return {"generate_s": round(time.perf_counter() - start, 2),
            "compile_s": {name: round(seconds, 2) for name, seconds in compile_seconds().items()},
            "route": engine.decode_route}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layers", default="2,8,28", help="comma list of depths")
    parser.add_argument("--forms", default="whole,by_layer")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--ffn", type=int, default=768)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--one", nargs=2, metavar=("FORM", "DEPTH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        args.form, args.depth = args.one[0], int(args.one[1])
        print(json.dumps(_one(args)))
        return
    points = {}
    passed = [a for a in (argv if argv is not None else sys.argv[1:])]
    for form in args.forms.split(","):
        for depth in args.layers.split(","):
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "OMP_NUM_THREADS": str(args.threads)}
                out = subprocess.run([sys.executable, __file__, *passed, "--one", form, depth], env=env,
                                     capture_output=True, text=True, check=True)
            points[f"{form}/{depth}"] = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{form} {depth} layers: {points[f'{form}/{depth}']}", file=sys.stderr, flush=True)
    print(json.dumps({"benchmark": "compile_speed", "device": args.device, "dtype": args.dtype,
                      "widths": {"hidden": args.hidden, "heads": args.heads, "kv_heads": args.kv_heads,
                                 "head_dim": args.head_dim, "ffn": args.ffn}, "points": points}))


if __name__ == "__main__":
    main()
