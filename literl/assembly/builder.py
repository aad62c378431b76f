"""Everything a run is built from, assembled from a Config (or from objects a Python user passes in).

This is where infrastructure choices are made (which model, which data, which device, which engine); the
trainer only drives the loop over what is assembled here. Each part is built once, finished: the engine and the
learner by `literl.assembly.engines` (in-process, asynchronous or on a cluster, decided there), the collector by
`literl.assembly.collection`, the forwards by `literl.training.forwards`. It sits above `literl.rollout`,
`literl.training` and `literl.model`, the one place that wires them together: rollout and training never import
each other.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Sequence

import torch

from literl.algorithm.diagnostics.mechanisms import MechanismDiagnostics
from literl.algorithm.objective import Objective
from literl.assembly.collection import Prompting, build_collector
from literl.assembly.engines import asynchronous, build_learner_and_engine, eval_engine
from literl.assembly.limits import check_max_new_tokens, check_rollout_memory, fit_prompts_to_context, max_positions
from literl.assembly.model_loading import load_policy, pad_token_id
from literl.assembly.training_set import training_problems
from literl.config.errors import ConfigError
from literl.config.load import resolve
from literl.config.multiturn_keys import multiturn_enabled
from literl.config.profiles import model_context
from literl.config.schema import Config
from literl.evaluation.periodic import build_evaluator
from literl.model.capabilities import capabilities
from literl.model.lora import AdaptersOff, apply_lora, is_lora, lora_enabled
from literl.model.precision import MASTER_DTYPE, compute_dtype
from literl.run.console import Console, LoadWatch
from literl.run.directory import claim_run_dir, give_up_run_dir, write_run_config
from literl.run.host_memory import retain_freed_host_memory
from literl.run.lock import DirectoryLock
from literl.run.manifest import Inputs, record_inputs
from literl.run.metrics_log import MetricsLog
from literl.run.provenance import default_threads
from literl.training.components import RunComponents
from literl.training.forwards import reference_forward


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
    policy = _trainable_policy(cfg, policy, device, console)
    data = training_problems(cfg, problems=problems, testbed=is_testbed)
    prompting = Prompting.from_config(cfg, tokenizer, testbed_problems=data.is_testbed)
    _check_sizes(cfg, data, policy, prompting, device, console)
    pad_id = pad_token_id(tokenizer)
    reference = _reference(cfg, objective, policy, device)
    learner, engine = build_learner_and_engine(cfg, policy=policy, reference=reference, objective=objective,
                                               tokenizer=tokenizer, pad_id=pad_id, device=device, run_dir=run_dir,
                                               console=console)
    collector = build_collector(cfg, problems=data.problems, prompting=prompting, engine=engine, objective=objective,
                                reward_fns=reward_fns, pad_id=pad_id)
    if cfg.rollout.max_staleness >= 1:
        engine, collector = asynchronous(cfg, collector, engine, learner, console)
    if multiturn_enabled(cfg.rollout):
        console.note("multi-turn rollouts with rollout.tools / rollout.environment; the held-out evaluation still "
                     "samples single turns without tools (docs/multiturn.md)")
    evaluator = build_evaluator(cfg, tokenizer=tokenizer)     # a missing benchmark fails before the folder exists
    # Written by the trainer once the run has started (RunComponents.record_start): a start that fails on a bad
    # path or name leaves no run behind, so the corrected command starts afresh instead of being told to resume;
    # a refused resume leaves config.yaml as it was.
    run_dir.mkdir(parents=True, exist_ok=True)
    log = MetricsLog(run_dir, cfg.trainer.trackers, json.loads(json.dumps(dataclasses.asdict(cfg), default=str)),
                     run_name=run_dir.name)
    _describe(cfg, policy, data, run_dir, device, console)
    return RunComponents(cfg=cfg, run_dir=run_dir, tokenizer=tokenizer, engine=engine, learner=learner,
                         objective=objective, collector=collector, evaluator=evaluator,
                         eval_engine=eval_engine(cfg, engine, learner, tokenizer, pad_id), log=log, console=console,
                         diagnostics=MechanismDiagnostics(decode=lambda ids: tokenizer.decode(ids)), lock=lock,
                         write_record=lambda: write_run_config(run_dir, cfg, inputs, engine))


def _trainable_policy(cfg: Config, policy: torch.nn.Module, device: torch.device, console: Console) -> torch.nn.Module:
    """The policy on its device with float32 master weights (the parameters, and so their gradients and AdamW's
    state, are float32 whatever model.dtype says; model.dtype is what the forward computes in:
    literl/model/precision.py), with its LoRA adapters when the config asks for them."""
    policy.to(device=device, dtype=MASTER_DTYPE)
    if lora_enabled(cfg):
        policy = apply_lora(policy, cfg.model.lora)
    if cfg.trainer.compile and not capabilities(policy).layers:
        console.note(f"trainer.compile=true has no effect on {type(policy).__name__}: it compiles literl's own "
                     "layer-by-layer forward, which runs Llama/Qwen-style decoders only")
    return policy


def _reference(cfg: Config, objective: Objective, policy: torch.nn.Module, device: torch.device):
    """The frozen reference's forward when the objective has a KL term (else None). With LoRA and no
    model.reference, the base model is the policy with its adapters off: no second copy (literl/model/lora.py)."""
    if not objective.needs_reference:
        return None
    if is_lora(policy) and not cfg.model.reference:
        return AdaptersOff(reference_forward(cfg, policy))
    return reference_forward(cfg, _reference_model(cfg, policy, device, compute_dtype(cfg.model.dtype)))


def _describe(cfg: Config, policy: torch.nn.Module, data, run_dir: Path, device: torch.device,
              console: Console) -> None:
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    total = sum(p.numel() for p in policy.parameters())
    console.note(f"run directory {run_dir} | device {device} | {total:,} parameters"
                 + (f" ({trainable:,} trained: LoRA adapters)" if trainable < total else "")
                 + f" | {len(data.problems):,} training problems ({data.description})")


def _quiet_hugging_face() -> None:
    """transformers draws a bar for every save/load of a few-MB model; literl shows its own progress."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()






def _device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA device is available; use trainer.device=cpu or auto")
    return torch.device(choice)


def _check_sizes(cfg: Config, data, policy, prompting: Prompting, device, console: Console) -> None:
    """Prompts that cannot fit the model's context are dropped from `data` (or refused); sizes that cannot fit
    the model or the memory at all are refused (literl/assembly/limits.py)."""
    check_max_new_tokens(cfg, policy)
    kept, overlong = fit_prompts_to_context(
        data.problems, lambda i: prompting.ids(str(data.problems[i]["problem"])), policy,
        max_new_tokens=cfg.rollout.max_new_tokens, overhead=len(prompting.ids("x")),
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



