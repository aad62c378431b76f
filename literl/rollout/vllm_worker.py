"""What literl adds to each vLLM worker (`LLM(worker_extension_cls=...)`); runs in the engine's environment.

vLLM mixes this class into its worker, so `self` is the worker and `LLM.collective_rpc("literl_...")` calls the
methods on every worker (one per tensor-parallel rank). Imports nothing from vLLM at module level and nothing
from literl, so that it loads in any process vLLM spawns.

Two jobs:
- `literl_set_temperature`: the model's logits are divided by the sampling temperature before vLLM's sampler
  sees them (vLLM then samples at temperature 1). vLLM's own log-probs are either `raw` (log-softmax of the
  logits *without* temperature) or `processed` (after temperature *and* top-k/top-p renormalisation); literl's
  definition is neither: log-softmax of logits / T over the full vocabulary (literl.rollout.sampling). With the
  division in the model, vLLM's raw log-probs are exactly that, and the sampled distribution is unchanged
  (vLLM applies temperature before top-k/top-p; greedy is argmax, which a positive scale keeps).
- `literl_load_weights`: the weight sync on CPU: load a safetensors file in place, then redo what the reload
  leaves stale on CPU (a tied `lm_head` whose repacked copy is built from `embed_tokens`).
"""

from __future__ import annotations

import time


class LiterlWorkerExtension:
    def literl_set_temperature(self, temperature: float) -> None:
        model = self.model_runner.get_model()
        if not hasattr(model, "_literl_unscaled_compute_logits"):
            model._literl_unscaled_compute_logits = model.compute_logits

            def compute_logits(*args, **kwargs):
                logits = model._literl_unscaled_compute_logits(*args, **kwargs)
                scale = model._literl_temperature
                # float32 first, as literl divides: bf16 logits / T would round once more than the trainer does.
                return logits if scale == 1.0 or logits is None else logits.float() / scale

            model.compute_logits = compute_logits
        model._literl_temperature = float(temperature)

    def literl_load_weights(self, path: str) -> dict:
        """Reload every tensor of the safetensors file at `path` (checkpoint names, e.g. `model.layers.0...`)."""
        from safetensors import safe_open

        start = time.perf_counter()

        def tensors():
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)

        self.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)
        reprocessed = self._literl_refresh_tied_head()
        return {"load_seconds": time.perf_counter() - start, "reprocessed_tied_head": reprocessed}

    def _literl_refresh_tied_head(self) -> bool:
        """A tied head shares `embed_tokens`' weight, so the checkpoint has no tensor for it and the reload never
        re-processes it; on CPU, processing builds the packed copy the head's matmul reads (oneDNN / sgl kernel
        weight packing). Without this, a machine that packs a copy samples from the old head."""
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return False
        model = self.model_runner.get_model()
        head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)     # Llama/Qwen-style decoders
        weight = getattr(head, "weight", None)
        if weight is None or embed is None or getattr(embed, "weight", None) is None:
            return False
        if weight.data_ptr() != embed.weight.data_ptr() or getattr(head, "quant_method", None) is None:
            return False
        head.quant_method.process_weights_after_loading(head)
        return True
