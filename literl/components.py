"""Everything a run is built from, assembled from a Config (or from objects a Python user passes in).

This is where infrastructure choices are made (which model, which data, which device, which engine); the
trainer only drives the loop over what is assembled here. It sits above `literl.rollout`, `literl.training` and
`literl.model`, the one place that wires them together: rollout and training never import each other.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from literl.config import Config
from literl.config_loader import resolve
from literl.data.files import write_json_atomic
from literl.diagnostics.mechanisms import MechanismDiagnostics
from literl.host_memory import retain_freed_host_memory
from literl.model import PolicyForward
from literl.model.capabilities import capabilities, records_forward
from literl.model.precision import MASTER_DTYPE, PRECISIONS, compute_dtype
from literl.model.quantize import WEIGHT_FORMATS
from literl.objective import Objective
from literl.rollout.collector import Collector, PromptStream
from literl.rollout.generator import SamplingParams
from literl.registry import ConfigError
from literl.rollout.hf_engine import HFEngine
from literl.provenance import default_threads
from literl.training.console import Console, LoadWatch
from literl.run_lock import DirectoryLock
from literl.evaluation.periodic import build_evaluator, prompt_options_of, prompt_template
from literl.lora import AdaptersOff, apply_lora, is_lora, lora_enabled
from literl.profiles import model_context
from literl.training.limits import check_max_new_tokens, check_rollout_memory, fit_prompts_to_context, max_positions
from literl.training.metrics import MetricsLog
from literl.training.model_loading import eos_token_ids, load_policy, pad_token_id
from literl.training.learner import InProcessLearner
from literl.training.optim import build_optimizer
from literl.training.problems import training_problems
from literl.training.run_directory import claim_run_dir, give_up_run_dir, write_run_config
from literl.training.run_record import Inputs, record_inputs


@dataclass
class RunComponents:
    cfg: Config
    run_dir: Path
    device: torch.device
    policy: torch.nn.Module
    policy_forward: PolicyForward           # log-probs of the policy (owns the record of the rollout's forward)
    tokenizer: Any
    # log-probs of the frozen reference policy (KL), when the objective has one (LoRA: the policy, adapters off)
    reference: PolicyForward | AdaptersOff | None
    engine: Any
    learner: Any                            # the update and the no-grad passes (literl.training.learner)
    objective: Objective
    collector: Collector
    optimizer: torch.optim.Optimizer
    scheduler: Any
    evaluator: Callable
    eval_engine: Callable[[], Any]          # the engine the held-out evaluation samples with (eval.policy)
    log: MetricsLog
    console: Console
    diagnostics: MechanismDiagnostics
    started: float = field(default_factory=time.perf_counter)
    lock: DirectoryLock | None = None       # held from build_components until the run ends (one writer per run)
    write_record: Callable[[], None] | None = None      # config.yaml and run.json's session, not yet written

    def record_start(self) -> None:
        """Write config.yaml and this session's entry in run.json, once the run has really started: for a resume,
        after its checkpoint loaded, so that a resume refused there (an override that does not fit the
        checkpoint) changes neither and a later plain resume still works."""
        if self.write_record is not None:
            self.write_record()
            self.write_record = None

    def finish(self, eval_results: dict, steps: int | None = None, no_learning_signal: str | None = None) -> None:
        """Write the run's summary and diagnostics, print the before/after table. `steps`: the steps the final
        model was trained for (a resume with trainer.steps below its checkpoint keeps the checkpoint's);
        `no_learning_signal`: why no step of the run had a learning signal, when none had (kept in summary.json)."""
        wall = time.perf_counter() - self.started
        steps = self.cfg.trainer.steps if steps is None else steps
        summary = {"run_dir": str(self.run_dir), "steps": steps, "wall_seconds": wall,
                   "preset": self.cfg.preset, "seed": self.cfg.seed, "eval": eval_results,
                   **({"no_learning_signal": no_learning_signal} if no_learning_signal else {})}
        write_json_atomic(self.run_dir / "summary.json", summary)
        self.diagnostics.write(self.run_dir / "diagnostics.json")
        self.log.close()
        if hasattr(self.collector, "shutdown"):     # an asynchronous run's producer thread
            self.collector.shutdown()
        if hasattr(self.engine, "close"):      # an engine in its own process (rollout.engine=vllm)
            self.engine.close()
        self.console.summary(self.run_dir, eval_results, wall)

    def release(self) -> None:
        """Let another process write to the run directory, and stop a cluster's actors (called when the run ends,
        however it ends)."""
        for part in (self.collector, self.engine, self.learner):
            # an asynchronous run's producer thread (first: it may be using the engine), the Ray rollout workers
            # and trainer ranks
            stop = getattr(part, "shutdown", None)
            if stop is not None:
                stop()
        if self.lock is not None:
            self.lock.release()


def build_components(cfg: Config, *, model: torch.nn.Module | str | None = None, tokenizer=None,
                     problems: Sequence[dict] | str | None = None,
                     reward_fns: Sequence | None = None, console: Console | None = None) -> RunComponents:
    # What Python passed in that a config can name goes into the config; run.json describes the rest.
    cfg, inputs = record_inputs(cfg, model=model, tokenizer=tokenizer, problems=problems, reward_fns=reward_fns)
    notes: list[str] = []
    cfg = resolve(cfg, external_model=model is not None, notes=notes, model_context=model_context(model))
    objective = Objective.from_config(cfg)      # a bad trick parameter value fails here, before anything slow loads
    threads = cfg.trainer.threads or default_threads()
    console = console or Console(cfg.trainer.progress, plain_every=cfg.trainer.log_every,
                                 watch=LoadWatch(threads=threads))
    for note in notes:
        console.note(note)
    _quiet_hugging_face()
    torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed)
    device = _device(cfg.trainer.device)
    if cfg.trainer.retain_host_memory and device.type == "cpu":
        retain_freed_host_memory()
    run_dir, lock, created = claim_run_dir(cfg, console)
    try:
        return _assemble(cfg, objective, run_dir, lock, device, console, inputs, model=model, tokenizer=tokenizer,
                         problems=problems, reward_fns=reward_fns)
    except BaseException:
        give_up_run_dir(run_dir, lock, created)
        raise


def _assemble(cfg: Config, objective: Objective, run_dir: Path, lock: DirectoryLock, device: torch.device,
              console: Console, inputs: Inputs, *, model, tokenizer, problems, reward_fns) -> RunComponents:
    if cfg.cluster.address is not None:
        from literl.distributed import connect

        connect(cfg.cluster)        # Ray missing or a cluster out of reach fails here, before anything slow loads
    _check_reference_path(cfg)
    policy, tokenizer, is_testbed = load_policy(cfg, model=model, tokenizer=tokenizer, console=console)
    # Master weights: the parameters (and so their gradients and AdamW's state) are float32 whatever model.dtype
    # says; model.dtype is what the forward computes in (literl/model/precision.py).
    policy.to(device=device, dtype=MASTER_DTYPE)
    compute = compute_dtype(cfg.model.dtype)
    if lora_enabled(cfg):
        policy = apply_lora(policy, cfg.model.lora)
    if cfg.trainer.compile and not capabilities(policy).layers:
        console.note(f"trainer.compile=true has no effect on {type(policy).__name__}: it compiles literl's own "
                     "layer-by-layer forward, which runs Llama/Qwen-style decoders only")
    data = training_problems(cfg, problems=problems, testbed=is_testbed)
    template = prompt_template(cfg, testbed_problems=data.is_testbed)
    prompt_options = prompt_options_of(cfg)
    _check_sizes(cfg, data, policy, tokenizer, template, prompt_options, device, console)
    pad_id = pad_token_id(tokenizer)
    policy_forward = PolicyForward(policy, temperature=cfg.rollout.temperature, compile=cfg.trainer.compile,
                                   record_max_bytes=_record_bytes(cfg, device),
                                   max_tokens=cfg.trainer.micro_batch_tokens,
                                   routing_replay=cfg.algorithm.routing_replay,
                                   router_aux_loss=cfg.algorithm.router_aux_loss_coef > 0, compute_dtype=compute,
                                   packed=cfg.trainer.packed_attention)
    if cfg.rollout.engine == "vllm":
        from literl.rollout.vllm_engine import engine_from_config

        # An asynchronous run's engine works while the trainer does: they split trainer.threads between them.
        engine_cfg = _with_threads(cfg, _async_thread_split(cfg)[0]) if cfg.rollout.max_staleness >= 1 else cfg
        engine = engine_from_config(engine_cfg, policy, eos_token_ids=eos_token_ids(policy, tokenizer),
                                    pad_id=pad_id, console=console)
    else:
        engine = HFEngine(policy, **_engine_options(cfg, policy, tokenizer, pad_id), recorder=policy_forward.recorder)
    reference = None
    if objective.needs_reference and is_lora(policy) and not cfg.model.reference:
        # The base model is the policy with its adapters off: no second copy (literl/lora.py).
        reference = AdaptersOff(PolicyForward(policy, temperature=cfg.rollout.temperature,
                                              compile=cfg.trainer.compile, max_tokens=cfg.trainer.micro_batch_tokens,
                                              compute_dtype=compute, packed=cfg.trainer.packed_attention))
    elif objective.needs_reference:
        reference = PolicyForward(_reference_model(cfg, policy, device, compute), temperature=cfg.rollout.temperature,
                                  compile=cfg.trainer.compile, max_tokens=cfg.trainer.micro_batch_tokens,
                                  compute_dtype=compute, packed=cfg.trainer.packed_attention)

    from literl.data.prompts import render_prompt
    from literl.rewards import RewardSet

    prompt_cache: dict[int, list[int]] = {}

    def prompt_ids(index: int) -> list[int]:
        if index not in prompt_cache:
            prompt_cache[index] = render_prompt(data.problems[index]["problem"], tokenizer, template,
                                                **prompt_options)
        return prompt_cache[index]

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    rewards = RewardSet(_reward_specs(cfg, reward_fns), timeout_s=cfg.reward.timeout_s,
                        step_timeout_s=cfg.reward.step_timeout_s, max_failed_batches=cfg.reward.max_failed_batches,
                        chat_messages=_chat_messages(cfg, tokenizer, template))
    r = cfg.rollout
    sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens)
    collector = Collector(
        engine=engine, problems=data.problems, prompt_ids=prompt_ids, decode=decode, rewards=rewards,
        objective=objective, sampling=sampling, prompts_per_step=r.prompts_per_step, group_size=r.group_size,
        max_rounds=r.max_rounds, stream=PromptStream(len(data.problems), seed=cfg.seed), pad_id=pad_id,
        record_forward=cfg.trainer.replay_max_gib > 0)
    optimizer, scheduler = build_optimizer(cfg, policy)
    policy_forward.watch(optimizer)
    learner = InProcessLearner(policy=policy, policy_forward=policy_forward, reference=reference, objective=objective,
                               optimizer=optimizer, scheduler=scheduler,
                               micro_batch_tokens=cfg.trainer.micro_batch_tokens,
                               max_grad_norm=cfg.optim.max_grad_norm, device=device)
    if cfg.cluster.address is not None:
        # Rollout workers and trainer ranks on Ray: the same two protocols (Generator, Learner), other processes.
        from literl.distributed import start_cluster

        engine, learner = start_cluster(cfg, policy=policy, reference=None if reference is None else reference.model,
                                        objective=objective,
                                        engine_options=_engine_options(cfg, policy, tokenizer, pad_id),
                                        run_dir=run_dir, console=console)
        collector.engine = engine
    if cfg.rollout.max_staleness >= 1:
        engine, collector = _asynchronous(cfg, collector, engine, learner, policy, tokenizer, pad_id, console)
    evaluator = build_evaluator(cfg, tokenizer=tokenizer)
    # Written by the trainer once the run has started (RunComponents.record_start): a start that fails on a bad
    # path or name leaves no run behind, so the corrected command starts afresh instead of being told to resume;
    # a refused resume leaves config.yaml as it was.
    run_dir.mkdir(parents=True, exist_ok=True)
    log = MetricsLog(run_dir, cfg.trainer.trackers, json.loads(json.dumps(dataclasses.asdict(cfg), default=str)),
                     run_name=run_dir.name)
    diagnostics = MechanismDiagnostics(decode=lambda ids: tokenizer.decode(ids))
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    total = sum(p.numel() for p in policy.parameters())
    console.note(f"run directory {run_dir} | device {device} | {total:,} parameters"
                 + (f" ({trainable:,} trained: LoRA adapters)" if trainable < total else "")
                 + f" | {len(data.problems):,} training problems ({data.description})")
    return RunComponents(cfg=cfg, run_dir=run_dir, device=device, policy=policy, policy_forward=policy_forward,
                         tokenizer=tokenizer, reference=reference, engine=engine, learner=learner, objective=objective,
                         collector=collector,
                         optimizer=optimizer, scheduler=scheduler, evaluator=evaluator,
                         eval_engine=_eval_engine(cfg, engine, learner, tokenizer, pad_id), log=log, console=console,
                         diagnostics=diagnostics, lock=lock,
                         write_record=lambda: write_run_config(run_dir, cfg, inputs, engine))


def _asynchronous(cfg: Config, collector: Collector, engine, learner, policy, tokenizer, pad_id: int,
                  console: Console):
    """rollout.max_staleness = k >= 1: the engine samples from weight snapshots of its own, a producer thread runs
    the collector up to k batches ahead (literl/rollout/async_rollout.py, docs/async.md). Returns the engine and the
    collector the trainer sees."""
    from literl.rollout.async_rollout import AsyncCollector, VersionedEngine, WeightVersions, detached_copy

    r = cfg.rollout
    engine_threads = trainer_threads = None
    if isinstance(engine, HFEngine):
        # literl's engine in this process: a generation thread on its own copy of the weights, no forward record
        # (the update never runs with the weights that sampled). The two threads split the cores.
        engine = HFEngine(detached_copy(policy), **_engine_options(cfg, policy, tokenizer, pad_id))
        engine_threads, trainer_threads = _async_thread_split(cfg)
    elif r.engine == "vllm" and cfg.cluster.address is None:
        _, trainer_threads = _async_thread_split(cfg)       # the engine process took the rest at its start
        torch.set_num_threads(trainer_threads)
    versions = WeightVersions(learner.policy())
    versions.publish(learner.policy())           # version 0: the starting weights
    versioned = VersionedEngine(engine, versions)
    console.note(f"asynchronous rollouts: batch s is sampled under policy version max(0, s-{r.max_staleness})"
                 + (", responses switch to the next version mid-way (partial rollouts)" if r.partial_rollouts else "")
                 + (f"; generation thread {engine_threads} torch thread(s), update {trainer_threads}"
                    if engine_threads else ""))
    async_collector = AsyncCollector(collector, versioned, max_staleness=r.max_staleness, seed=cfg.seed,
                                     steps=cfg.trainer.steps, partial_rollouts=r.partial_rollouts,
                                     threads=engine_threads, trainer_threads=trainer_threads)
    return versioned, async_collector


def _async_thread_split(cfg: Config) -> tuple[int, int]:
    """(engine threads, trainer threads) of an asynchronous run whose engine shares this machine's cores:
    rollout.async_engine_threads (default half of trainer.threads, at least 1) and the rest (at least 1)."""
    threads = cfg.trainer.threads or default_threads()
    engine = cfg.rollout.async_engine_threads or max(1, threads // 2)
    return engine, max(1, threads - engine)


def _with_threads(cfg: Config, threads: int) -> Config:
    import dataclasses

    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, threads=threads))


def _quiet_hugging_face() -> None:
    """transformers draws a bar for every save/load of a few-MB model; literl shows its own progress."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _eval_engine(cfg: Config, engine, learner, tokenizer, pad_id: int) -> Callable[[], Any]:
    """The engine the held-out evaluation samples with. eval.policy=engine: the rollout engine, what is deployed (an
    FP8, 4-bit or bfloat16 engine's rounded copy of the weights, a vLLM engine, Ray rollout workers).
    eval.policy=trainer: literl's engine over the trainer's own weights (`learner.policy()`: the module itself in one
    process, the driver's copy gathered from the ranks on a cluster), built at the first evaluation: no copy, no
    rounding, so a comparison of training–inference corrections is scored on the policy they trained."""
    if cfg.eval.policy == "engine":
        return lambda: engine
    built: list[HFEngine] = []

    def trainer_engine() -> HFEngine:
        # The same module at every call; on a cluster the driver's copy, gathered again after an update.
        policy = learner.policy()
        if not built:       # no own dtype and no rounding: the engine samples from the module itself
            built.append(HFEngine(policy, **{**_engine_options(cfg, policy, tokenizer, pad_id),
                                             "dtype": None, "weights": None}))
        return built[0]
    return trainer_engine


def _engine_options(cfg: Config, policy: torch.nn.Module, tokenizer, pad_id: int) -> dict:
    """HFEngine's arguments besides the model and the recorder (the same for the rollout workers of a cluster)."""
    return dict(eos_token_ids=eos_token_ids(policy, tokenizer), pad_id=pad_id, dtype=_engine_dtype(cfg),
                weights=cfg.rollout.dtype if cfg.rollout.dtype in WEIGHT_FORMATS else None, decode=cfg.rollout.decode,
                compile=cfg.rollout.compile)


def _engine_dtype(cfg: Config) -> torch.dtype | None:
    """The engine's own precision (None: it samples from the policy module itself, whose float32 master weights
    the rollout then computes in); an FP8 or 4-bit engine computes in bfloat16 on weights rounded to its format. A
    bfloat16 engine keeps its own bfloat16 copy, refreshed at every weight sync."""
    if cfg.rollout.dtype in WEIGHT_FORMATS:
        return torch.bfloat16
    dtype = PRECISIONS[cfg.rollout.dtype]
    return None if dtype == MASTER_DTYPE else dtype


def _record_bytes(cfg: Config, device: torch.device) -> int:
    """Memory the rollout may use to keep its forward for the update to replay: trainer.replay_max_gib where the
    replay pays (`capabilities.records_forward`: CPU) and the update computes in the parameters' dtype (a bfloat16
    update over float32 master weights would replay float32 outputs), else 0."""
    if not records_forward(device) or compute_dtype(cfg.model.dtype) != MASTER_DTYPE:
        return 0
    return int(cfg.trainer.replay_max_gib * 2**30)


def _device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA device is available; use trainer.device=cpu or auto")
    return torch.device(choice)


def _check_sizes(cfg: Config, data, policy, tokenizer, template: str, prompt_options: dict, device,
                 console: Console) -> None:
    """Prompts that cannot fit the model's context are dropped from `data` (or refused); sizes that cannot fit
    the model or the memory at all are refused (literl/training/limits.py)."""
    from literl.data.prompts import render_prompt

    check_max_new_tokens(cfg, policy)
    kept, overlong = fit_prompts_to_context(
        data.problems, lambda i: render_prompt(str(data.problems[i]["problem"]), tokenizer, template, **prompt_options),
        policy, max_new_tokens=cfg.rollout.max_new_tokens,
        overhead=len(render_prompt("x", tokenizer, template, **prompt_options)),
        on_overlong=cfg.data.overlong_prompts)
    if overlong:
        console.note(f"WARNING: skipped {len(overlong)} of {len(data.problems)} training problems whose prompt + "
                     f"rollout.max_new_tokens={cfg.rollout.max_new_tokens} exceeds the model's {max_positions(policy)} "
                     f"positions (first: row {overlong[0]}); data.overlong_prompts=error refuses them instead")
        data.problems = kept
    check_rollout_memory(cfg, policy, device)


def _check_reference_path(cfg: Config) -> None:
    """A local model.reference that does not exist fails here with its key, not deep inside transformers."""
    ref = cfg.model.reference
    looks_local = ref and (ref.startswith(("/", ".", "~")) or ref.count("/") != 1)
    if looks_local and not Path(ref).expanduser().is_dir():
        raise FileNotFoundError(f"model.reference={ref} is not a directory; point it at a model saved with "
                                "save_pretrained, or leave it unset for a frozen copy of the starting policy")


def _reference_model(cfg: Config, policy: torch.nn.Module, device, dtype: torch.dtype) -> torch.nn.Module:
    """The frozen reference policy, in the policy's compute dtype (no optimizer: no master weights)."""
    if cfg.model.reference:
        from transformers import AutoModelForCausalLM

        reference = AutoModelForCausalLM.from_pretrained(cfg.model.reference, dtype=dtype).to(device=device,
                                                                                              dtype=dtype)
    else:
        reference = copy.deepcopy(policy).to(dtype=dtype)
    reference.eval().requires_grad_(False)
    return reference


def _reward_specs(cfg: Config, reward_fns: Sequence | None) -> list[tuple]:
    """Config reward specs, or functions passed from Python: f, 'pkg.mod:fn', (f, weight) or
    (f, weight, convention)."""
    if reward_fns is None:
        return [(spec.fn, spec.weight, spec.convention) for spec in cfg.reward.fns]
    specs = []
    for item in reward_fns:
        fn, weight, convention = (*item, "auto")[:3] if isinstance(item, tuple) else (item, 1.0, "auto")
        specs.append((fn, float(weight), convention))
    return specs


def _chat_messages(cfg: Config, tokenizer, template: str):
    """With a chat template, TRL-style reward functions get TRL's conversational format: the prompt messages."""
    from literl.data.prompts import chat_messages, resolve_template

    if resolve_template(template, tokenizer) != "chat":
        return None
    return lambda example: chat_messages(example["problem"], system_prompt=cfg.data.system_prompt or "",
                                         instruction=cfg.data.instruction)
