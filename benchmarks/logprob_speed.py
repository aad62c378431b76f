"""Speed of token log-probs + entropy on the benchmark workload (vocabulary 100): chunked vs direct.

128 responses of 64 tokens after the 16 testbed prompts (right-padded rows, as the trainer builds them).
Passes, run round-robin (medians over repeats):
  train  forward + backward of Σ w·logp + 0.01 Σ w·H   (the update's micro-batch)
  nograd forward only under torch.no_grad              (old_logp / ref_logp passes)
for `direct` (full logits from the model's forward, log_softmax), `chunked` (`PolicyForward.token_logprobs`) and
`chunked_masked` (`PolicyForward.token_logprobs(mask_BT=...)`: the head skips padding). Prints one JSON line.

    python benchmarks/logprob_speed.py --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import workload  # noqa: E402
from literl.model import PolicyForward  # noqa: E402


def _batch(tokenizer, response_tokens: int, seed: int = 0):
    """Right-padded prompt + response rows; response lengths spread over [response_tokens / 4, response_tokens]."""
    prompts = workload.rollout_prompts(tokenizer)
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(response_tokens // 4, response_tokens + 1, (len(prompts),), generator=g)
    L = max(len(p) for p in prompts) + response_tokens
    tokens_BL = torch.full((len(prompts), L), tokenizer.pad_token_id, dtype=torch.long)
    mask_BT = torch.arange(response_tokens)[None, :] < lengths[:, None]
    for b, p in enumerate(prompts):
        n = int(lengths[b])
        tokens_BL[b, :len(p)] = torch.tensor(p)
        tokens_BL[b, len(p):len(p) + n] = torch.randint(3, 100, (n,), generator=g)
    prompt_len_B = torch.tensor([len(p) for p in prompts])
    return tokens_BL, prompt_len_B, mask_BT


def _direct(model, tokens_BL, prompt_len_B, T, with_entropy):
    z_BLV = model(input_ids=tokens_BL).logits.float()
    pos_BT = (prompt_len_B[:, None] - 1 + torch.arange(T)[None, :]).clamp(max=tokens_BL.shape[1] - 2)
    z_BTV = z_BLV.gather(1, pos_BT[:, :, None].expand(-1, -1, z_BLV.shape[-1]))
    logp_BTV = torch.log_softmax(z_BTV, -1)
    logp_BT = logp_BTV.gather(-1, tokens_BL.gather(1, pos_BT + 1)[..., None]).squeeze(-1)
    return logp_BT, (-(logp_BTV.exp() * logp_BTV).sum(-1) if with_entropy else None)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=workload.TORCH_THREADS)
    parser.add_argument("--response-tokens", type=int, default=workload.MAX_NEW_TOKENS)
    args = parser.parse_args(argv)
    workload.set_threads(args.threads)
    model, tokenizer = workload.build_model()
    model.train()
    tokens_BL, prompt_len_B, mask_BT = _batch(tokenizer, args.response_tokens)
    T = args.response_tokens
    weight_BT = mask_BT.float() / mask_BT.sum()
    forward = PolicyForward(model)

    def compute(kind, with_entropy):
        if kind == "direct":
            return _direct(model, tokens_BL, prompt_len_B, T, with_entropy)
        return forward.token_logprobs(tokens_BL, prompt_len_B, T, with_entropy=with_entropy,
                                      mask_BT=mask_BT if kind == "chunked_masked" else None)

    def train(kind):
        def run(_):
            model.zero_grad(set_to_none=True)
            logp_BT, entropy_BT = compute(kind, True)
            ((weight_BT * logp_BT).sum() + 0.01 * (weight_BT * entropy_BT).sum()).backward()
        return run

    def nograd(kind):
        def run(_):
            with torch.no_grad():
                compute(kind, False)
        return run

    kinds = ["direct", "chunked", "chunked_masked"]
    variants = {f"{k}/train": train(k) for k in kinds} | {f"{k}/nograd": nograd(k) for k in kinds}
    for run in variants.values():
        run(0)
    wall, cpu = workload.interleaved_seconds(variants, args.repeats)
    results = {name: {"wall_s": round(statistics.median(wall[name]), 4),
                      "cpu_s": round(statistics.median(cpu[name]), 4)} for name in variants}
    workload.print_json({
        "benchmark": "logprob_speed", "rows": int(tokens_BL.shape[0]), "padded_length": int(tokens_BL.shape[1]),
        "response_tokens": int(mask_BT.sum()), "results": results, "machine": workload.machine(),
    })


if __name__ == "__main__":
    main()
