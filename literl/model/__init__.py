"""The decoder runtime: the model's forward written once, for every pass that runs it.

Below both `literl.rollout` (sampling) and `literl.training` (the update): neither reimplements a layer, and a
feature that touches the forward (routes, dtype, sharding, replay of recorded projections) is added here once.

    layer.py         the layer body (`decoder_layer`) and the structure it needs
    kernels.py       RMS norm with a hand backward, rotary, per-head views, row selections
    attention.py     the attention step per kind of pass: cached and fixed (decode), dense (prompts, prefix),
                     replayed
    record.py        the rollout's forward kept for the update: recorder, record, recording/replayed projections
    prompt_pass.py   distinct prompts, the prompt pass, prefill
    decode.py        decode steps: static KV cache (the body), fixed-shape (one shape per batch size), or the
                     model's own forward
    cuda_graphs.py   the fixed-shape decode step captured as CUDA graphs, one per batch bucket
    forward.py       a training forward: shared prompts, replayed, or whole rows by length
    grouping.py      which rows share a training forward
    head.py          the LM head as log-probs and entropies, tile by tile
    capabilities.py  which modes a model supports (the one place that probes)
    policy.py        `PolicyForward`: what the trainer asks for log-probs
    compiled.py      torch.compile for functions whose sizes change from call to call; compile times
    lora.py          LoRA adapters on the policy, and the reference as the policy with its adapters off
    precision.py, quantize.py, packing.py, moe.py   dtypes, engine weight formats, packed rows, MoE routes

Modes of the body, and who runs them:

    mode                          attention         projections   caller
    decode step                   cached            computed      rollout (StaticKVDecoder)
    fixed-shape decode step       fixed             computed      rollout (FixedShapeDecoder; CUDA graphs)
    decode step, recording        cached (+ kept)   recording     rollout, on-policy update ahead
    prompt pass (prefill, prefix) dense             computed      rollout prefill, training forward
    responses after a prefix      dense + prefix    computed      training forward
    replay of a record            replayed          replayed      on-policy update, old-log-prob pass
"""

from literl.model.policy import PolicyForward

__all__ = ["PolicyForward"]
