"""Peak memory of token log-probs + entropy, forward and backward, at a real Qwen vocabulary (151,936).

The benchmark Qwen3 body (hidden 256, 4 layers) with a 151,936-token tied head; 64 responses × 512 tokens
after 32-token prompts, forward and backward of Σ w·logp + 0.01·Σ w·H. Measured, each in a fresh process:
  chunked  `literl.model.PolicyForward.token_logprobs(..., with_entropy=True)` at full size
  body     the decoder alone (its activations), so that chunked − body is what the head adds
  direct   full logits + log_softmax; its logits alone are 64 × 512 × 151,936 × 4 B = 18.5 GiB, so it runs at a
           few rows and is extrapolated linearly in rows (its memory is linear in rows)
On CPU the figure is peak RSS (ru_maxrss) minus the RSS before the pass, on CUDA `max_memory_allocated` minus
the memory before the pass. `--checkpoint-layers` turns on the model's gradient checkpointing (a trainer
choice) to show what is left once the decoder's activations are not all kept. Prints one JSON line (GiB).

    python benchmarks/logprob_memory.py                       # 64 × 512, vocab 151,936
    python benchmarks/logprob_memory.py --rows 8 --direct-rows 1,2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import workload  # noqa: E402

GIB = 1024 ** 3


def _batch(rows: int, prompt: int, response: int, vocab: int, device):
    g = torch.Generator().manual_seed(0)
    tokens_BL = torch.randint(3, vocab, (rows, prompt + response), generator=g).to(device)
    prompt_len_B = torch.full((rows,), prompt, device=device)
    return tokens_BL, prompt_len_B


def _direct(model, tokens_BL, prompt_len_B, T):
    """The computation the chunked path replaces: full logits, log_softmax, entropy from the log-probs."""
    z_BLV = model(input_ids=tokens_BL[:, :-1], use_cache=False).logits.float()
    z_BTV = z_BLV[:, prompt_len_B[0] - 1:]
    logp_BTV = torch.log_softmax(z_BTV, dim=-1)
    logp_BT = logp_BTV.gather(-1, tokens_BL[:, prompt_len_B[0]:, None]).squeeze(-1)
    return logp_BT, -(logp_BTV.exp() * logp_BTV).sum(-1)


def child(mode: str, rows: int, prompt: int, response: int, vocab: int, device: str, checkpoint: bool,
          threads: int) -> dict:
    from literl.model import PolicyForward

    workload.set_threads(threads)
    dev = torch.device(device)
    model, _ = workload.build_model(vocab_size=vocab)
    model.to(dev).train()
    if checkpoint:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    tokens_BL, prompt_len_B = _batch(rows, prompt, response, vocab, dev)
    weight_BT = torch.randn(rows, response, generator=torch.Generator().manual_seed(1)).to(dev) / (rows * response)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = workload.rss_bytes()
    start = time.perf_counter()
    if mode == "chunked":
        logp_BT, entropy_BT = PolicyForward(model).token_logprobs(tokens_BL, prompt_len_B, response,
                                                                   with_entropy=True)
    elif mode == "direct":
        logp_BT, entropy_BT = _direct(model, tokens_BL, prompt_len_B, response)
    else:
        hidden_BLH = model.get_decoder()(input_ids=tokens_BL[:, :-1], use_cache=False).last_hidden_state
        logp_BT = entropy_BT = hidden_BLH[:, prompt - 1:].sum(-1)
    loss = (weight_BT * logp_BT).sum() + 0.01 * (weight_BT * entropy_BT).sum()
    loss.backward()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = workload.peak_rss_bytes()
    return {"mode": mode, "rows": rows, "seconds": time.perf_counter() - start,
            "pass_peak_gib": (peak - before) / GIB, "process_peak_gib": peak / GIB}


def _run_child(args, mode: str, rows: int) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--rows", str(rows), "--prompt", str(args.prompt),
           "--response", str(args.response), "--vocab", str(args.vocab), "--device", args.device]
    cmd += ["--threads", str(args.threads)] + (["--checkpoint-layers"] if args.checkpoint_layers else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--response", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--direct-rows", default="1,2", help="row counts at which the direct path is measured")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--checkpoint-layers", action="store_true", help="the model's gradient checkpointing")
    parser.add_argument("--threads", type=int, default=workload.TORCH_THREADS)
    parser.add_argument("--child", choices=["chunked", "direct", "body"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.rows, args.prompt, args.response, args.vocab, args.device,
                               args.checkpoint_layers, args.threads)))
        return
    chunked = _run_child(args, "chunked", args.rows)
    body = _run_child(args, "body", args.rows)
    direct = [_run_child(args, "direct", int(r)) for r in args.direct_rows.split(",")]
    (r0, m0), (r1, m1) = ((run["rows"], run["pass_peak_gib"]) for run in (direct[0], direct[-1]))
    per_row = (m1 - m0) / (r1 - r0) if r1 != r0 else m0 / r0
    direct_estimate = m0 + per_row * (args.rows - r0)
    logits_gb = args.rows * args.response * args.vocab * 4 / GIB
    print(json.dumps({
        "benchmark": "logprob_memory", "device": args.device, "rows": args.rows, "response_tokens": args.response,
        "prompt_tokens": args.prompt, "vocab": args.vocab, "checkpoint_layers": args.checkpoint_layers,
        "chunked_pass_peak_gib": round(chunked["pass_peak_gib"], 3),
        "chunked_process_peak_gib": round(chunked["process_peak_gib"], 3),
        "chunked_seconds": round(chunked["seconds"], 2),
        "body_pass_peak_gib": round(body["pass_peak_gib"], 3),
        "head_adds_gib": round(chunked["pass_peak_gib"] - body["pass_peak_gib"], 3),
        "direct_estimated_pass_peak_gib": round(direct_estimate, 2),
        "direct_logits_alone_gib": round(logits_gb, 2),
        "direct_measured": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items()} for d in direct],
        "machine": {**workload.machine(), "threads": args.threads},
    }))


if __name__ == "__main__":
    main()
