"""The vLLM engine process: `python -m literl.rollout.vllm_server`, started by `literl.rollout.vllm_engine`.

It runs in the engine's own environment (vLLM pins its own transformers; on CPU, vLLM also replaces
`torch.set_num_threads` and reseeds the global RNG of the process it runs in, which must not be the trainer's).
The trainer writes one JSON line to its stdin (the model folder, vLLM's arguments, the socket address and the
connection's key), then talks to it over a `multiprocessing.connection` on a Unix socket only its user can
reach: pickled (operation, payload) requests, ("ok", result) or ("error", traceback) replies, one at a time.

Operations: `generate` (token-id prompts → token ids, sampled-token log-probs, finish reasons, routed experts),
`load_weights` (CPU sync: reload from a safetensors file), `update_weights_ipc` (GPU sync: vLLM's CUDA-IPC
weight transfer), `shutdown`. The process also exits when the trainer's connection closes or the trainer dies.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection, Listener

WORKER_EXTENSION = "literl.rollout.vllm_worker.LiterlWorkerExtension"
PROTOCOL = 1        # raised when the requests or replies change, so that a stale engine environment is caught
PARENT_POLL_SECONDS = 1.0


class EngineServer:
    """One `vllm.LLM` and the operations the trainer may ask of it."""

    def __init__(self, spec: dict):
        from vllm import LLM

        self.llm = LLM(model=spec["model"], skip_tokenizer_init=True, generation_config="vllm",
                       worker_extension_cls=WORKER_EXTENSION, **spec["llm_kwargs"])
        self.temperature: float | None = None
        self.ipc_ready = False

    def info(self) -> dict:
        import torch
        import vllm

        return {"protocol": PROTOCOL, "vllm_version": vllm.__version__, "torch_version": torch.__version__,
                "pid": os.getpid(), "threads": torch.get_num_threads()}

    def generate(self, payload: dict) -> list[list[tuple]]:
        """One vLLM request per (prompt, n, seed); per request, its n samples as (token ids, log-probs, finish
        reason, routed experts or None), in sample order."""
        import torch
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        temperature = float(payload["temperature"])
        if temperature != self.temperature:
            self.llm.collective_rpc("literl_set_temperature", args=(temperature,))
            self.temperature = temperature
        common = dict(max_tokens=payload["max_tokens"], logprobs=0, flat_logprobs=True, detokenize=False,
                      ignore_eos=True, stop_token_ids=list(payload["stop_token_ids"]))
        if payload["greedy"]:
            common.update(temperature=0.0)
        else:   # the logits already carry the temperature (LiterlWorkerExtension.literl_set_temperature)
            common.update(temperature=1.0, top_p=payload["top_p"], top_k=payload["top_k"])
        prompts, params = [], []
        for prompt_ids, n, seed in payload["requests"]:
            prompts.append(TokensPrompt(prompt_token_ids=list(prompt_ids)))
            params.append(SamplingParams(n=n, seed=seed, **common))
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        result = []
        for output in outputs:
            samples = []
            for sample in sorted(output.outputs, key=lambda s: s.index):
                flat = sample.logprobs
                logprobs = [flat.logprobs[i] for i in flat.start_indices]
                routes = sample.routed_experts
                if routes is not None:
                    routes = torch.from_numpy(routes.astype("int16"))
                samples.append((list(sample.token_ids), logprobs, sample.finish_reason, routes))
            result.append(samples)
        return result

    def load_weights(self, payload: dict) -> dict:
        start = time.perf_counter()
        per_worker = self.llm.collective_rpc("literl_load_weights", args=(payload["path"],))
        # KV blocks computed with the old weights would otherwise be reused for prompts seen before.
        self.llm.reset_prefix_cache()
        return {**per_worker[0], "seconds": time.perf_counter() - start}

    def update_weights_ipc(self, payload: dict) -> dict:
        """vLLM's CUDA-IPC weight transfer (`LLM(weight_transfer_config={"backend": "ipc"})`): the trainer
        shares its GPU tensors by handle, the workers load them layer by layer. Untested here (no GPU)."""
        start = time.perf_counter()
        if not self.ipc_ready:
            self.llm.init_weight_transfer_engine({"init_info": {"packed": False}})
            self.ipc_ready = True
        self.llm.start_weight_update()
        self.llm.update_weights({"update_info": payload})
        self.llm.finish_weight_update()
        self.llm.reset_prefix_cache()
        return {"seconds": time.perf_counter() - start}


def serve(conn: Connection, server: EngineServer) -> None:
    operations = {"generate": server.generate, "load_weights": server.load_weights,
                  "update_weights_ipc": server.update_weights_ipc}
    while True:
        try:
            operation, payload = conn.recv()
        except (EOFError, OSError):
            return      # the trainer closed the connection or died
        if operation == "shutdown":
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", operations[operation](payload)))
        except Exception:
            conn.send(("error", traceback.format_exc()))


def _exit_with_parent(parent_pid: int) -> None:
    """The engine runs in its own session (the terminal's Ctrl-C reaches only the trainer, which then stops it);
    if the trainer dies without stopping it, this ends it."""
    def watch():
        while True:
            time.sleep(PARENT_POLL_SECONDS)
            if os.getppid() != parent_pid:
                os._exit(3)

    threading.Thread(target=watch, daemon=True, name="literl-parent-watch").start()


def main() -> int:
    spec = json.loads(sys.stdin.readline())
    _exit_with_parent(spec["parent_pid"])
    print(f"[literl] vLLM engine process {os.getpid()} starting: {json.dumps(spec['llm_kwargs'])}", flush=True)
    with Listener(spec["address"], family="AF_UNIX", authkey=bytes.fromhex(spec["authkey"])) as listener:
        conn = listener.accept()
    try:
        server = EngineServer(spec)
    except BaseException:
        message = traceback.format_exc()
        print(message, file=sys.stderr, flush=True)
        conn.send(("error", message))
        return 1
    conn.send(("ready", server.info()))
    print("[literl] vLLM engine ready", flush=True)
    serve(conn, server)
    print("[literl] vLLM engine stopping", flush=True)
    try:
        server.llm.llm_engine.engine_core.shutdown()     # its workers, where it has worker processes
    finally:
        # The interpreter's own teardown of vLLM and torch takes ~5 s and releases nothing the OS would not.
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
