"""Everything a run is built from, assembled from a Config (or from objects a Python user passes in).

This is where infrastructure choices are made (which model, which data, which device, which engine); the
trainer only drives the loop over what is assembled here. It sits above `literl.rollout`, `literl.training` and
`literl.model`, the one place that wires them together: rollout and training never import each other.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from literl.config import Config
from literl.config_loader import from_yaml_file, resolve, to_yaml
from literl.data.files import write_json_atomic, write_text_atomic
from literl.diagnostics.mechanisms import MechanismDiagnostics
from literl.host_memory import retain_freed_host_memory
from literl.model import PolicyForward
from literl.model.capabilities import capabilities
from literl.model.quantize import WEIGHT_FORMATS
from literl.objective import Objective
from literl.rollout.collector import Collector, PromptStream
from literl.rollout.generator import SamplingParams
from literl.registry import ConfigError
from literl.rollout.hf_engine import HFEngine
from literl.provenance import default_threads
from literl.training.console import Console, LoadWatch
from literl.run_lock import LOCK_NAME, DirectoryLock
from literl.training.checkpoint import checkpoint_candidates, remove_stale_temporaries
from literl.evaluation.periodic import build_evaluator, prompt_options_of, prompt_template
from literl.lora import AdaptersOff, apply_lora, is_lora, lora_enabled
from literl.profiles import model_context
from literl.training.limits import check_max_new_tokens, check_rollout_memory, fit_prompts_to_context, max_positions
from literl.training.metrics import MetricsLog
from literl.training.model_loading import eos_token_ids, load_policy, pad_token_id
from literl.training.learner import InProcessLearner
from literl.training.optim import build_optimizer
from literl.training.problems import training_problems
from literl.training.run_record import Inputs, config_header, record_inputs, write_run_record

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


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
    log: MetricsLog
    console: Console
    diagnostics: MechanismDiagnostics
    started: float = field(default_factory=time.perf_counter)
    lock: DirectoryLock | None = None       # held from build_components until the run ends (one writer per run)

    def finish(self, eval_results: dict, steps: int | None = None) -> None:
        """Write the run's summary and diagnostics, print the before/after table. `steps`: the steps the final
        model was trained for (a resume with trainer.steps below its checkpoint keeps the checkpoint's)."""
        wall = time.perf_counter() - self.started
        steps = self.cfg.trainer.steps if steps is None else steps
        summary = {"run_dir": str(self.run_dir), "steps": steps, "wall_seconds": wall,
                   "preset": self.cfg.preset, "seed": self.cfg.seed, "eval": eval_results}
        write_json_atomic(self.run_dir / "summary.json", summary)
        self.diagnostics.write(self.run_dir / "diagnostics.json")
        self.log.close()
        if hasattr(self.engine, "close"):      # an engine in its own process (rollout.engine=vllm)
            self.engine.close()
        self.console.summary(self.run_dir, eval_results, wall)

    def release(self) -> None:
        """Let another process write to the run directory, and stop a cluster's actors (called when the run ends,
        however it ends)."""
        for part in (self.engine, self.learner):
            stop = getattr(part, "shutdown", None)      # the Ray rollout workers and trainer ranks
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
    run_dir, lock, created = _claim_run_dir(cfg, console)
    try:
        return _assemble(cfg, objective, run_dir, lock, device, console, inputs, model=model, tokenizer=tokenizer,
                         problems=problems, reward_fns=reward_fns)
    except BaseException:
        _give_up_run_dir(run_dir, lock, created)
        raise


def _assemble(cfg: Config, objective: Objective, run_dir: Path, lock: DirectoryLock, device: torch.device,
              console: Console, inputs: Inputs, *, model, tokenizer, problems, reward_fns) -> RunComponents:
    if cfg.cluster.address is not None:
        from literl.distributed import connect

        connect(cfg.cluster)        # Ray missing or a cluster out of reach fails here, before anything slow loads
    _check_reference_path(cfg)
    policy, tokenizer, is_testbed = load_policy(cfg, model=model, tokenizer=tokenizer, console=console)
    policy.to(device=device, dtype=DTYPES[cfg.model.dtype])
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
                                   record_max_bytes=int(cfg.trainer.replay_max_gib * 2**30),
                                   max_tokens=cfg.trainer.micro_batch_tokens,
                                   routing_replay=cfg.algorithm.routing_replay,
                                   router_aux_loss=cfg.algorithm.router_aux_loss_coef > 0)
    if cfg.rollout.engine == "vllm":
        from literl.rollout.vllm_engine import engine_from_config

        engine = engine_from_config(cfg, policy, eos_token_ids=eos_token_ids(policy, tokenizer), pad_id=pad_id,
                                    console=console)
    else:
        engine = HFEngine(policy, **_engine_options(cfg, policy, tokenizer, pad_id), recorder=policy_forward.recorder)
    reference = None
    if objective.needs_reference and is_lora(policy) and not cfg.model.reference:
        # The base model is the policy with its adapters off: no second copy (literl/lora.py).
        reference = AdaptersOff(PolicyForward(policy, temperature=cfg.rollout.temperature,
                                              compile=cfg.trainer.compile, max_tokens=cfg.trainer.micro_batch_tokens))
    elif objective.needs_reference:
        reference = PolicyForward(_reference_model(cfg, policy, device), temperature=cfg.rollout.temperature,
                                  compile=cfg.trainer.compile, max_tokens=cfg.trainer.micro_batch_tokens)

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
                        step_timeout_s=cfg.reward.step_timeout_s,
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
                               optimizer=optimizer, scheduler=scheduler, micro_batch_tokens=cfg.trainer.micro_batch_tokens,
                               max_grad_norm=cfg.optim.max_grad_norm, device=device)
    if cfg.cluster.address is not None:
        # Rollout workers and trainer ranks on Ray: the same two protocols (Generator, Learner), other processes.
        from literl.distributed import start_cluster

        engine, learner = start_cluster(cfg, policy=policy, reference=None if reference is None else reference.model,
                                        objective=objective,
                                        engine_options=_engine_options(cfg, policy, tokenizer, pad_id),
                                        run_dir=run_dir, console=console)
        collector.engine = engine
    evaluator = build_evaluator(cfg, tokenizer=tokenizer)
    # Written once everything above loaded: a start that fails on a bad path or name leaves no run behind, so
    # the corrected command starts afresh instead of being told to resume.
    _write_run_config(run_dir, cfg, inputs, engine)
    log = MetricsLog(run_dir, cfg.trainer.trackers, json.loads(json.dumps(_as_dict(cfg), default=str)),
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
                         optimizer=optimizer, scheduler=scheduler, evaluator=evaluator, log=log, console=console,
                         diagnostics=diagnostics, lock=lock)


def _quiet_hugging_face() -> None:
    """transformers draws a bar for every save/load of a few-MB model; literl shows its own progress."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _engine_options(cfg: Config, policy: torch.nn.Module, tokenizer, pad_id: int) -> dict:
    """HFEngine's arguments besides the model and the recorder (the same for the rollout workers of a cluster)."""
    return dict(eos_token_ids=eos_token_ids(policy, tokenizer), pad_id=pad_id, dtype=_engine_dtype(cfg),
                weights=cfg.rollout.dtype if cfg.rollout.dtype in WEIGHT_FORMATS else None, decode=cfg.rollout.decode,
                compile=cfg.rollout.compile)


def _engine_dtype(cfg: Config) -> torch.dtype | None:
    """The engine's own precision (None: it samples from the policy module itself); an FP8 or 4-bit engine computes
    in bfloat16 on weights rounded to its format."""
    if cfg.rollout.dtype in WEIGHT_FORMATS:
        return torch.bfloat16
    return DTYPES[cfg.rollout.dtype] if cfg.rollout.dtype != cfg.model.dtype else None


def _device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA device is available; use trainer.device=cpu or auto")
    return torch.device(choice)


def _claim_run_dir(cfg: Config, console: Console) -> tuple[Path, DirectoryLock, bool]:
    """The run directory, locked for this process (one writer per run) and checked (before anything slow loads);
    also whether this call created it."""
    if cfg.trainer.output_dir:
        run_dir = Path(cfg.trainer.output_dir)
    else:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        run_dir = Path("runs") / f"{cfg.preset or 'custom'}-{stamp}"
    created = not run_dir.exists()
    lock = DirectoryLock(run_dir).acquire()
    try:
        _check_run_dir(run_dir, cfg, console)
        removed = remove_stale_temporaries(run_dir)     # under the lock: no other process is writing them
    except BaseException:
        _give_up_run_dir(run_dir, lock, created)
        raise
    if removed:
        console.note(f"removed {len(removed)} unfinished temporary file(s) left by an interrupted save: "
                     + ", ".join(str(p.relative_to(run_dir)) for p in removed[:3]) + (" …" if len(removed) > 3 else ""))
    return run_dir, lock, created


def _give_up_run_dir(run_dir: Path, lock: DirectoryLock, created: bool) -> None:
    """A start that failed leaves the directory as it found it (a directory it created is removed when empty)."""
    lock.release()
    if created:
        try:
            (run_dir / LOCK_NAME).unlink(missing_ok=True)
            run_dir.rmdir()
        except OSError:
            pass        # something else was written there: keep it


def _check_run_dir(run_dir: Path, cfg: Config, console: Console) -> None:
    """Refuse a directory that holds a run unless resuming, and a resume that would redo a finished run."""
    config_path = run_dir / "config.yaml"
    # A lone config.yaml (+ run.json) is what a start that failed while loading left behind.
    if run_dir.exists() and any(entry.name not in ("config.yaml", "run.json", LOCK_NAME)
                                for entry in run_dir.iterdir()):
        if not cfg.trainer.resume:
            raise FileExistsError(
                f"run directory {run_dir} already holds a run. Continue it with trainer.resume=true, or choose "
                f"another trainer.output_dir (nothing there was changed).")
        finished = [name for name in ("summary.json", "final") if (run_dir / name).exists()]
        if finished and not checkpoint_candidates(run_dir):
            raise FileExistsError(
                f"run directory {run_dir} holds a finished run ({' and '.join(finished)}) whose checkpoints were "
                "deleted, so it cannot be continued: resuming would retrain from step 0 and overwrite final/. "
                "Start a new run in another trainer.output_dir (nothing there was changed).")
        if config_path.exists():
            try:
                saved = from_yaml_file(config_path)
            except ConfigError as err:
                console.note(f"not comparing with the saved config: {err}")
            else:
                _warn_config_changes(saved, cfg, console)


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


def _write_run_config(run_dir: Path, cfg: Config, inputs: Inputs, engine) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run_dir / "config.yaml", config_header(inputs) + to_yaml(cfg))
    # An engine in its own process and environment (vLLM) reports its own versions: the trainer's are not its.
    info = getattr(getattr(engine, "process", None), "info", None) or {}
    write_run_record(run_dir, inputs, resume=cfg.trainer.resume,
                     engine={"name": cfg.rollout.engine, **{k: v for k, v in info.items() if k != "pid"}})
    if not cfg.trainer.output_dir:
        _point_latest(run_dir)


def _point_latest(run_dir: Path) -> None:
    link = run_dir.parent / "latest"
    try:
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(run_dir.name)
    except OSError:
        pass    # a convenience only (e.g. filesystems without symlinks)


def _warn_config_changes(old: Config, new: Config, console: Console) -> None:
    old_d, new_d = _flatten(_as_dict(old)), _flatten(_as_dict(new))
    ignored = ("trainer.resume", "trainer.steps", "trainer.progress", "trainer.output_dir", "trainer.threads",
               "trainer.compile", "eval.", "cluster.", "trainer.log_every")
    changed = [k for k in sorted(set(old_d) | set(new_d))
               if old_d.get(k) != new_d.get(k) and not k.startswith(ignored)]
    if changed:
        console.note("resuming with a config that differs from the saved one in: " + ", ".join(changed))


def _as_dict(cfg) -> dict:
    import dataclasses

    return dataclasses.asdict(cfg)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v and k not in ("params",):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _reference_model(cfg: Config, policy: torch.nn.Module, device) -> torch.nn.Module:
    if cfg.model.reference:
        from transformers import AutoModelForCausalLM

        reference = AutoModelForCausalLM.from_pretrained(cfg.model.reference).to(device)
    else:
        reference = copy.deepcopy(policy)
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
