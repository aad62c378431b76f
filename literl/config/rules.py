"""Which config values and tricks work together: `validate` checks every trick against its registry and every
cross-key rule in one place. Compatibility rules about trick names live here and nowhere else outside the
registries (style.md §3.5); `literl.config.load.load_config` calls `validate` on every config it builds.

Values a trick can only reject when it runs (a soft-overlong cache longer than the generation cap) are caught by
the objective's self-check when it is built (`literl.algorithm.objective.Objective.from_config`): once per run,
before the model loads, and by `literl config` / `literl ablate` for the configs they check.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

from literl.config.schema import Config
from literl.config.errors import ConfigError

# Algorithm fields that hold one trick, and the registry each one is checked against.
SINGLE_TRICKS = {"advantage": "advantage", "policy_loss": "policy_loss", "aggregation": "aggregation",
                 "is_correction": "is_correction", "kl": "kl", "group_filter": "group_filter"}
MULTI_TRICKS = {"loss_masks": "loss_mask", "policy_masks": "policy_mask", "reward_shaping": "reward_shaping"}
CHOICES = {
    "model.dtype": ("float32", "bfloat16"),
    "rollout.dtype": ("float32", "bfloat16", "float8_e4m3", "int4"),
    "algorithm.routing_replay": ("none", "r2", "r3"),
    "rollout.decode": ("auto", "static", "fixed", "dynamic"),
    "rollout.engine": ("native", "vllm"),
    "optim.schedule": ("constant", "linear", "cosine"),
    "trainer.recompute_old_logp": ("auto", "always"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "trainer.packed_attention": ("auto", "off", "varlen", "padded", "document_mask"),
    "data.template": ("auto", "plain", "chat", "raw"),
    "data.difficulty": ("easy", "medium", "hard", "mixed", "long"),
    "model.testbed": ("base", "aligned", "micro", "moe", "long", "long_aligned", "long_loopy", "aligned_varied",
                      "varied", "varied_aligned", "skewed_aligned", "checked", "direct", "moe_flat"),
    "model.profile": ("auto", "testbed", "real"),
    "algorithm.aggregation_normaliser": ("global", "local"),
    "data.overlong_prompts": ("skip", "error"),
    "eval.policy": ("engine", "trainer"),
}


# Upper bounds where a huge value would hang a step or exhaust memory rather than fail: each sits far above any
# setting a study uses, so it only catches a typo or a hostile value, at load, with one line.
MAX_SEED = 2**32 - 1        # seeds are combined arithmetically (data order, evaluation, vLLM requests) in int64
MAX_ROUNDS = 1000           # a step resamples at most this often; a filter that keeps nothing stops sooner
MAX_STALENESS = 64          # k + 1 weight copies in memory and k + 1 staleness-histogram metrics per step


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _check_vllm(r) -> None:
    v = r.vllm
    _check(r.engine != "vllm" or r.dtype in ("float32", "bfloat16"),
           f"rollout.engine=vllm runs rollout.dtype=float32 or bfloat16, not {r.dtype} (literl's FP8-like rounding "
           "is its own engine's: use rollout.engine=native; vLLM's own FP8, rollout.vllm.extra={quantization: fp8}, "
           "needs a GPU and is untested here)")
    _check(v.weight_sync in ("auto", "file", "ipc"),
           f"rollout.vllm.weight_sync={v.weight_sync!r} is not one of: auto, file, ipc")
    _check(0 < v.gpu_memory_utilization <= 1,
           f"rollout.vllm.gpu_memory_utilization={v.gpu_memory_utilization} must be in (0, 1]")
    _check(v.kv_cache_gib is None or v.kv_cache_gib > 0,
           f"rollout.vllm.kv_cache_gib={v.kv_cache_gib} must be > 0, or null for the default")
    _check(v.tensor_parallel_size >= 1, f"rollout.vllm.tensor_parallel_size={v.tensor_parallel_size} must be >= 1")
    _check(v.max_model_len is None or v.max_model_len >= 2,
           f"rollout.vllm.max_model_len={v.max_model_len} must be >= 2, or null for the model's own")
    _check(v.start_timeout_s > 0, f"rollout.vllm.start_timeout_s={v.start_timeout_s} must be > 0")
    _check(v.call_timeout_s > 0, f"rollout.vllm.call_timeout_s={v.call_timeout_s} must be > 0")

def _check_async(cfg: Config) -> None:
    r = cfg.rollout
    _check(r.max_staleness >= 0, f"rollout.max_staleness={r.max_staleness} must be >= 0 (0: the synchronous loop)")
    _check(r.max_staleness <= MAX_STALENESS,
           f"rollout.max_staleness={r.max_staleness} is above the limit {MAX_STALENESS}: the engine would hold "
           f"k + 1 copies of the weights and log k + 1 staleness metrics a step; studies use 1 to 8")
    _check(r.max_staleness <= max(cfg.trainer.steps, 1),
           f"rollout.max_staleness={r.max_staleness} exceeds trainer.steps={cfg.trainer.steps}: the bound could "
           f"never be reached and every batch would come from the starting policy; set rollout.max_staleness <= "
           f"trainer.steps")
    _check(not r.partial_rollouts or r.max_staleness >= 1,
           "rollout.partial_rollouts=true switches a running response to a newer policy version, which only an "
           "asynchronous run has: set rollout.max_staleness >= 1, or partial_rollouts=false")
    _check(not r.partial_rollouts or (r.engine == "native" and cfg.cluster.address is None),
           "rollout.partial_rollouts=true needs literl's own engine in the trainer's process (rollout.engine=native, "
           "cluster.address=null): it loads the next version's weights between two decode steps of a running batch, "
           "which the vLLM engine's offline API and the Ray rollout workers do not offer; use max_staleness alone "
           "there")
    _check(r.max_staleness == 0 or r.engine != "native" or cfg.cluster.address is not None
           or not (r.compile or cfg.trainer.compile),
           "rollout.max_staleness >= 1 with literl's engine in the trainer's process runs generation and the update "
           "in two threads at once, and torch.compile is not safe to run from two threads: set rollout.compile=false "
           "and trainer.compile=false, or use rollout.engine=vllm (or Ray rollout workers, cluster.address)")
    _check(r.async_engine_threads is None or r.async_engine_threads >= 1,
           f"rollout.async_engine_threads={r.async_engine_threads} must be >= 1, or null for half of trainer.threads")


def _check_finite(node, prefix: str = "") -> None:
    """NaN or ±inf in any setting (optim.lr=inf, rescale.low=nan) would poison every weight: refuse it at load."""
    if dataclasses.is_dataclass(node):
        items = [(f.name, getattr(node, f.name)) for f in dataclasses.fields(node)]
    elif isinstance(node, dict):
        items = list(node.items())
    elif isinstance(node, (list, tuple)):
        items = list(enumerate(node))
    else:
        if isinstance(node, float) and not math.isfinite(node):
            raise ConfigError(f"{prefix}={node} is not a finite number; give a finite value (for no limit, "
                              f"leave the key unset or use its documented 'off' value)")
        return
    for key, value in items:
        _check_finite(value, f"{prefix}.{key}" if prefix else str(key))


def _warn_band_off_the_reward_scale(algo) -> None:
    """ROLL's mean filter band (0, 1) is for a {0, 1} reward; the filter sees the reward after `rescale`."""
    from literl.algorithm.tricks import GROUP_FILTERS, REWARD_SHAPING

    if algo.group_filter.name != "mean_in_band" or "rescale" not in algo.reward_shaping:
        return
    band = {**GROUP_FILTERS.params_of("mean_in_band"), **algo.group_filter.params}
    scale = {**REWARD_SHAPING.params_of("rescale"), **algo.reward_shaping["rescale"]}
    low, high = scale["low"], scale["high"]
    if band["metric"] == "reward" and (band["low"], band["high"]) == (0.0, 1.0) and (low, high) != (0.0, 1.0):
        warnings.warn(f"mean_in_band's band (0, 1) is ROLL's for a {{0, 1}} reward, but reward_shaping.rescale maps "
                      f"the reward onto {{{low}, {high}}} before the filter: set algorithm.group_filter.params.low="
                      f"{low} and high={high} for the same rule (algorithms.md §4.3)")


def validate(cfg: Config) -> None:
    """Every rule about which values and tricks work together, in one function."""
    from literl.config.plugins import import_user_modules, load_entry_points
    from literl.algorithm.tricks import ALL

    _check_finite(cfg)
    # The user's own tricks register when their modules import: before any name is checked.
    load_entry_points()
    import_user_modules(cfg.imports)
    algo = cfg.algorithm
    context = {"max_new_tokens": cfg.rollout.max_new_tokens}    # what Objective.from_config fills in
    for field_name, axis in SINGLE_TRICKS.items():
        spec = getattr(algo, field_name)
        ALL[axis].check(spec.name, spec.params, where=f"algorithm.{field_name}", context=context)
    for field_name, axis in MULTI_TRICKS.items():
        for name, params in getattr(algo, field_name).items():
            ALL[axis].check(name, params or {}, where=f"algorithm.{field_name}.{name}", context=context)
    for key, valid in CHOICES.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        _check(value in valid, f"{key}={value!r} is not one of: {', '.join(valid)}")

    r, t, o, ev = cfg.rollout, cfg.trainer, cfg.optim, cfg.eval
    _check(r.prompts_per_step >= 1 and r.group_size >= 1,
           "rollout.prompts_per_step and rollout.group_size must be >= 1")
    # null: the profile's value (literl/config/profiles.py), filled by config.load.resolve.
    _check(r.max_new_tokens is None or r.max_new_tokens >= 1, "rollout.max_new_tokens must be >= 1, or null for the "
                                                              "profile's")
    # Sampling settings are otherwise checked only when the first rollout starts, after the model has loaded.
    _check(r.temperature is None or r.temperature > 0,
           f"rollout.temperature={r.temperature} must be > 0 (the log-probs are divided by it); use a small value "
           "such as 0.1 for near-greedy sampling")
    _check(r.top_p is None or 0 < r.top_p <= 1,
           f"rollout.top_p={r.top_p} must be in (0, 1]; 1.0 disables nucleus sampling")
    _check(r.top_k is None or r.top_k >= 0, f"rollout.top_k={r.top_k} must be >= 0; 0 disables top-k sampling")
    _check(ev.temperature is None or ev.temperature > 0,
           f"eval.temperature={ev.temperature} must be > 0, or null for rollout.temperature; greedy accuracy "
           "is reported separately by eval.greedy=true")
    _check(ev.max_new_tokens is None or ev.max_new_tokens >= 1,
           f"eval.max_new_tokens={ev.max_new_tokens} must be >= 1, or null for rollout.max_new_tokens")
    _check(ev.limit is None or ev.limit >= 1, f"eval.limit={ev.limit} must be >= 1, or null for every problem")
    _check(ev.every >= 0, f"eval.every={ev.every} must be >= 0 (0: evaluate only before and after training)")
    _check(cfg.data.limit is None or cfg.data.limit >= 1,
           f"data.limit={cfg.data.limit} must be >= 1, or null to train on every problem")
    _check(len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas),
           f"optim.betas={list(o.betas)} must be two numbers in [0, 1), e.g. optim.betas=[0.9,0.999]")
    _check(o.lr is None or o.lr > 0, f"optim.lr={o.lr} must be > 0, or null for the model's default")
    _check(o.eps > 0, f"optim.eps={o.eps} must be > 0")
    _check(o.weight_decay >= 0, f"optim.weight_decay={o.weight_decay} must be >= 0")
    _check(o.max_grad_norm >= 0, f"optim.max_grad_norm={o.max_grad_norm} must be >= 0 (0 disables clipping)")
    _check(o.warmup_steps >= 0, f"optim.warmup_steps={o.warmup_steps} must be >= 0")
    _check(algo.kl_coef >= 0, f"algorithm.kl_coef={algo.kl_coef} must be >= 0 (0 disables the KL term)")
    _check(algo.entropy_coef >= 0, f"algorithm.entropy_coef={algo.entropy_coef} must be >= 0 (0 disables the "
                                   "entropy bonus)")
    _check(algo.router_aux_loss_coef >= 0, f"algorithm.router_aux_loss_coef={algo.router_aux_loss_coef} must be >= 0 "
                                           "(0 turns the MoE load-balancing loss off)")
    _check(t.threads is None or t.threads >= 1, f"trainer.threads={t.threads} must be >= 1, or null for the CPUs "
                                                "this process may use")
    _check(t.log_every >= 1, f"trainer.log_every={t.log_every} must be >= 1 (a log line every N steps)")
    _check(t.save_every >= 0, f"trainer.save_every={t.save_every} must be >= 0 (0: save by time only, "
                              "trainer.save_every_minutes)")
    _check(t.save_every_minutes >= 0, f"trainer.save_every_minutes={t.save_every_minutes} must be >= 0 (0: off)")
    _check(t.max_non_finite_steps >= 0, f"trainer.max_non_finite_steps={t.max_non_finite_steps} must be >= 0 "
                                        "(0: never stop on non-finite steps)")
    _check(t.keep_checkpoints >= 0, f"trainer.keep_checkpoints={t.keep_checkpoints} must be >= 0 (0: keep all)")
    _check(t.log_samples >= 0, f"trainer.log_samples={t.log_samples} must be >= 0")
    _check(r.max_rounds >= 1, "rollout.max_rounds must be >= 1 (1 = no resampling)")
    _check(r.max_rounds <= MAX_ROUNDS,
           f"rollout.max_rounds={r.max_rounds} is above the limit {MAX_ROUNDS}; dynamic sampling needs a few rounds "
           f"(DAPO: up to 10), and a group filter that keeps nothing stops the step long before")
    _check(isinstance(cfg.seed, int) and not isinstance(cfg.seed, bool) and 0 <= cfg.seed <= MAX_SEED,
           f"seed={cfg.seed} must be an integer from 0 to {MAX_SEED} (2^32 - 1)")
    _check(t.steps >= 0, "trainer.steps must be >= 0")
    _check(1 <= t.minibatches <= r.prompts_per_step,
           f"trainer.minibatches={t.minibatches} must be between 1 and rollout.prompts_per_step={r.prompts_per_step} "
           "(mini-batches hold whole groups)")
    _check(t.epochs >= 1, f"trainer.epochs={t.epochs} must be >= 1 (1: each rollout batch is trained on once)")
    _check(t.micro_batch_tokens == "auto" or (isinstance(t.micro_batch_tokens, int)
                                              and not isinstance(t.micro_batch_tokens, bool)
                                              and t.micro_batch_tokens >= 1),
           f"trainer.micro_batch_tokens={t.micro_batch_tokens!r} must be an integer >= 1, or auto (16384 on CPU, "
           "sized from free GPU memory on CUDA)")
    _check(t.replay_max_gib >= 0, f"trainer.replay_max_gib={t.replay_max_gib} must be >= 0 (0 turns replay off)")
    _check(ev.samples >= 1, "eval.samples must be >= 1")
    _check(cfg.reward.timeout_s > 0, "reward.timeout_s must be > 0")
    _check(cfg.reward.max_failed_batches >= 0, "reward.max_failed_batches must be >= 0 (0: never stop)")
    _check(cfg.reward.step_timeout_s >= cfg.reward.timeout_s,
           f"reward.step_timeout_s={cfg.reward.step_timeout_s} must be >= reward.timeout_s={cfg.reward.timeout_s} "
           "(the step's budget holds at least one full check)")
    _check(len(cfg.reward.fns) >= 1, "reward.fns needs at least one function (the first decides accuracy)")
    for fn in cfg.reward.fns:
        _check(":" in fn.fn, f"reward fn '{fn.fn}' must be an import path 'package.module:function'")
        _check(fn.convention in ("auto", "literl", "trl", "verl"),
               f"reward fn '{fn.fn}': convention={fn.convention!r} is not one of: auto, literl, trl, verl")
    lora = cfg.model.lora
    _check(lora.rank >= 0, f"model.lora.rank={lora.rank} must be >= 0 (0 turns LoRA off)")
    _check(lora.alpha > 0, f"model.lora.alpha={lora.alpha} must be > 0")
    _check(0 <= lora.dropout < 1, f"model.lora.dropout={lora.dropout} must be in [0, 1)")
    _check(len(lora.target_modules) >= 1, "model.lora.target_modules needs at least one module name, or [all-linear]")
    for tracker in t.trackers:
        _check(tracker in ("tensorboard", "wandb"), f"trainer.trackers: unknown tracker '{tracker}' "
                                                     "(valid: tensorboard, wandb)")
    c = cfg.cluster
    _check(c.address is None or str(c.address).strip() != "",
           "cluster.address is empty: use null (one process), local, or a Ray cluster's address")
    _check(c.trainer_ranks >= 1, f"cluster.trainer_ranks={c.trainer_ranks} must be >= 1")
    _check(c.rollout_workers >= 1, f"cluster.rollout_workers={c.rollout_workers} must be >= 1")
    _check(c.cpus_per_worker > 0, f"cluster.cpus_per_worker={c.cpus_per_worker} must be > 0")
    _check(c.gpus_per_worker >= 0, f"cluster.gpus_per_worker={c.gpus_per_worker} must be >= 0 (0: CPU)")
    _check(c.sync_bucket_mb > 0, f"cluster.sync_bucket_mb={c.sync_bucket_mb} must be > 0")
    _check(c.address is None or r.engine != "vllm",
           "cluster.address with rollout.engine=vllm: the rollout workers of a Ray cluster run literl's HF engine "
           "(a vLLM engine per worker is not built yet); set rollout.engine=native, or cluster.address=null")
    _check(c.address is None or cfg.model.lora.rank == 0,
           "cluster.address with model.lora.rank > 0: the trainer ranks shard a plain model and the rollout workers "
           "sync its weights; LoRA runs in one process for now (set cluster.address=null, or model.lora.rank=0)")

    _check_vllm(r)
    _check_async(cfg)

    # Combinations that silently do the wrong thing in other frameworks.
    _check(not (algo.policy_loss.name == "minirl" and algo.is_correction.name != "none"),
           "algorithm.policy_loss=minirl already weights tokens by π_θ/μ_old (with its own TIS); set "
           "algorithm.is_correction.name=none, or use minirl's params (tis_cap, train_infer_is)")
    _check(not (algo.bypass_mode and algo.routing_replay == "r2"),
           "algorithm.routing_replay=r2 replays the routes of the old-log-prob pass, which algorithm.bypass_mode "
           "skips; use routing_replay=r3 (the engine's routes) or turn bypass_mode off")
    _check(not (algo.bypass_mode and algo.is_correction.name != "none"),
           "algorithm.bypass_mode uses the rollout log-probs as old_logp, so the ratio already covers the "
           "training–inference gap and an IS correction would always be 1; set algorithm.is_correction.name=none")
    if algo.policy_loss.name in ("gspo", "gspo_token") and algo.aggregation.name != "seq_mean_token_mean":
        warnings.warn(f"{algo.policy_loss.name} is defined with seq_mean_token_mean aggregation "
                      f"(algorithms.md §2.5); {algo.aggregation.name} weights each sequence by its length")
    if algo.policy_loss.name == "gmpo" and algo.aggregation.name != "seq_mean_token_mean":
        warnings.warn(f"gmpo puts its per-sequence loss on every token and is defined with seq_mean_token_mean "
                      f"aggregation (algorithms.md §10.1); {algo.aggregation.name} weights each sequence by its length")
    if algo.policy_loss.name in ("clip_cov", "kl_cov") and algo.aggregation.name != "token_mean":
        warnings.warn(f"{algo.policy_loss.name} is defined with token_mean aggregation (the paper's token-level loss, "
                      f"algorithms.md §10.5-10.6); {algo.aggregation.name} weighs tokens differently")
    if algo.policy_loss.name == "kl_cov" and t.minibatches == 1 and t.epochs == 1 and not algo.bypass_mode:
        warnings.warn("kl_cov's |log ρ| penalty has zero gradient while ρ = 1, and with trainer.minibatches=1 every "
                      "update is on-policy: the run is the plain policy gradient (algorithms.md §10.6); set "
                      "trainer.minibatches > 1, as the paper's recipes do")
    if algo.group_filter.name != "keep_all" and r.max_rounds == 1:
        warnings.warn("a group filter with rollout.max_rounds=1 drops groups without refilling the batch; "
                      "set rollout.max_rounds>1 to resample (DAPO dynamic sampling)")
    _warn_band_off_the_reward_scale(algo)
    if algo.kl_in_reward and algo.kl_coef == 0:
        warnings.warn("algorithm.kl_in_reward=true has no effect while algorithm.kl_coef=0")
