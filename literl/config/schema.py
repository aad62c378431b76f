"""The config tree: typed dataclasses, loaded with OmegaConf from defaults ← preset ← YAML file ← key=value.

Every trick is a `TrickSpec(name, params)`; its parameters' defaults live in the trick function's signature
(one source of truth) and are checked against it when the config loads, so a typo fails in the first
second. Multi-entry axes (`loss_masks`, `policy_masks`, `reward_shaping`) are maps from trick name to params,
applied in order; a map given in a later layer replaces the earlier one whole, while a dotted override into one entry
merges (`...soft_overlong.factor=0.5`) and `...soft_overlong=null` removes it. `literl config --explain`
prints every key with its help text.

    literl train --preset dapo algorithm.policy_loss.name=cispo algorithm.policy_loss.params.ub=5.0
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from literl.data.prompts import INSTRUCTION
from literl.config.errors import ConfigError


# Upper bounds where a huge value would hang a step or exhaust memory rather than fail: each sits far above any
# setting a study uses, so it only catches a typo or a hostile value, at load, with one line.
MAX_SEED = 2**32 - 1        # seeds are combined arithmetically (data order, evaluation, vLLM requests) in int64
MAX_ROUNDS = 1000           # a step resamples at most this often; a filter that keeps nothing stops sooner
MAX_STALENESS = 64          # k + 1 weight copies in memory and k + 1 staleness-histogram metrics per step


def knob(default: Any = dataclasses.MISSING, help: str = "", *, factory=None, range: str | None = None,
         choices: tuple[str, ...] | None = None, null: str | None = None, hint: str | None = None):
    """A config field with its help text (shown by `literl config --explain` and `--help`) and the values it takes,
    which `literl.config.rules.validate` checks when a config loads and `--explain` shows:

        range    clauses in the trick registries' grammar (literl.algorithm.registry): '>= 0', '> 0 and <= 1',
                 '>= timeout_s' (a key of the same section), '<= rollout.prompts_per_step' (a full key)
        choices  the strings it may hold (each item, for a list); with a range too: a choice, or a number in it
        null     what null means, for a key that may be null ("for the profile's"), said with the error
        hint     what a value means or how to fix one, said with the error ("0 disables clipping")
    """
    metadata = {"help": help, "range": range, "choices": tuple(choices) if choices else None, "null": null,
                "hint": hint}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def valid_values(metadata) -> str:
    """A knob's declared values as text for `--explain` and the reference page ('> 0, or null', 'auto, or a number
    >= 1', 'float32, bfloat16'); '' if none."""
    parts = []
    if metadata.get("choices"):
        parts.append(", ".join(metadata["choices"]))
    if metadata.get("range"):
        parts.append(("or a number " if parts else "") + metadata["range"])
    if parts and metadata.get("null"):
        parts.append("or null")
    return ", ".join(parts)


@dataclass
class TrickSpec:
    name: str = knob(help="registered name of the trick (see `literl config --explain` for the valid names)")
    params: dict[str, Any] = knob(help="keyword parameters; unset ones take the function's defaults",
                                  factory=dict)


def trick(name: str, **params) -> TrickSpec:
    return TrickSpec(name=name, params=dict(params))


@dataclass
class LoraSpec:
    rank: int = knob(0, "LoRA rank r through peft (pip install 'literl[lora]'); 0: no LoRA, every weight trains",
                     range=">= 0", hint="0 turns LoRA off")
    alpha: float = knob(16.0, "LoRA alpha: the adapter's output is scaled by alpha / rank", range="> 0")
    target_modules: list[str] = knob(help="modules that get adapters, e.g. [q_proj,k_proj,v_proj,o_proj]; "
                                          "[all-linear]: every linear layer but the output head",
                                     factory=lambda: ["all-linear"])
    dropout: float = knob(0.0, "dropout on the adapter's input, in [0, 1) (active in the update only, so the "
                               "on-policy ratio is not exactly 1 when > 0)", range=">= 0 and < 1")


@dataclass
class ModelConfig:
    path: str | None = knob(None, "Hugging Face model directory (or hub id when the hub is reachable). "
                                  "null: the embedded testbed model")
    testbed: str = knob("base", "testbed starting policy when path is null: base | aligned | micro | moe (a tiny "
                                "Qwen3-MoE, 8 experts, 2 per token, warmed up like base) | long, long_aligned (base "
                                "taught the long tier's 1-12 operation chains; aligned: then clean solutions) | "
                                "long_loopy (long that repeats its last step line in half its solutions, often past a "
                                "160-token budget: a base model's no-stop repetition) | "
                                "aligned_varied (aligned taught solutions in randomly chosen equivalent forms: many "
                                "tokens with valid alternatives) | varied, varied_aligned (base and aligned taught "
                                "those forms from the start) | skewed_aligned (varied taught them mostly in one "
                                "form: valid alternatives at a few percent, for clip-higher) | checked (base that "
                                "checks every step in half its solutions: longer, more often right, cut by a short "
                                "budget) | direct (base that answers at once, without steps, in half its solutions: "
                                "short, and right far less often at 3-4 operations) | moe_flat (moe with "
                                "router margins shrunk, so routes drift under updates): docs/testbed.md",
                                choices=("base", "aligned", "micro", "moe", "long", "long_aligned", "long_loopy",
                                         "aligned_varied", "varied", "varied_aligned", "skewed_aligned", "checked",
                                         "direct", "moe_flat"))
    testbed_prebuilt: bool = knob(True, "on the testbed's first use, install the weights shipped with literl for "
                                        "its recipe (base) instead of building them (~5 min on 2 cores); false "
                                        "builds them here (bitwise identical with the build's torch and threads). "
                                        "An already cached testbed is used either way: docs/testbed.md")
    profile: str = knob("auto", "defaults for the keys left null (response length, sampling, lr, eval benchmarks, "
                                "system prompt): testbed | real (the seed study's setup, algorithms.md §8.1, with "
                                "max_new_tokens capped by the model's context) | auto (real for a Hugging Face "
                                "model: model.path set or a model passed to literl.train; literl/config/profiles.py)",
                                choices=("auto", "testbed", "real"))
    dtype: str = knob("float32", "training precision: float32 | bfloat16 (matmuls and attention in bfloat16 over "
                                 "float32 master weights, gradients and AdamW state; the reference model in "
                                 "bfloat16; final/ saved in bfloat16, checkpoints in float32: literl/model/"
                                 "precision.py)", choices=("float32", "bfloat16"))
    reference: str | None = knob(None, "reference model for KL; null: a frozen copy of the starting policy (with "
                                       "LoRA: the policy with its adapters switched off, no copy)")
    lora: LoraSpec = knob(help="LoRA adapters (literl/model/lora.py): only they train; final/ holds the merged "
                               "model and final/adapter/", factory=LoraSpec)


@dataclass
class DataConfig:
    train: str | None = knob(None, "training problems: a .jsonl file, a benchmark name in data.dir, a .parquet "
                                   "file or a Hugging Face dataset id (these two: pip install 'literl[hub]'). null: "
                                   "the testbed's train split")
    dir: str | None = knob(None, "data directory for benchmark names (else $LITERL_DATA_DIR)")
    problem_field: str = knob("problem", "field holding the problem text")
    answer_field: str = knob("answer", "field holding the gold answer")
    id_field: str = knob("id", "field holding a row id (row number when absent)")
    template: str = knob("auto", "prompt template: auto (the tokenizer's declared one, e.g. raw for the testbed; else "
                                 "chat if it has a chat template; else plain) | plain | chat | raw",
                                 choices=("auto", "plain", "chat", "raw"))
    system_prompt: str | None = knob(None, "system message of chat prompts ('' for none); null: the profile's "
                                           "(real: the seed study's 'Please reason step by step, and put your final "
                                           "answer within \\boxed{}.'; testbed: none)")
    instruction: str = knob(INSTRUCTION, "text after the problem, on its own line, in plain and chat prompts ('' for "
                                         "none); a chat prompt whose system prompt is this same text does not "
                                         "repeat it")
    chat_template_kwargs: dict[str, Any] = knob(help="extra arguments of the tokenizer's chat template, e.g. "
                                                     "{enable_thinking: false} for Qwen3", factory=dict)
    difficulty: str = knob("mixed", "testbed training tier: easy | medium | hard | mixed | long (1-12 operations, "
                                    "solutions 7x apart in length: the long testbeds' tier, docs/testbed.md)",
                                    choices=("easy", "medium", "hard", "mixed", "long"))
    size: int = knob(20000, "testbed training problems to generate")
    limit: int | None = knob(None, "use only the first N training problems (N >= 1); null: all of them",
                             range=">= 1", null="to train on every problem")
    overlong_prompts: str = knob("skip", "problems whose prompt + rollout.max_new_tokens exceeds the model's "
                                         "positions: skip (with a counted warning) | error", choices=("skip", "error"))


@dataclass
class VllmConfig:
    python: str | None = knob(None, "the vLLM engine environment's python; null: $LITERL_VLLM_PYTHON, else .venv-vllm "
                                    "(./run.sh vllm-setup), else this python when it has vllm")
    gpu_memory_utilization: float = knob(0.5, "GPU: fraction of the GPU's memory vLLM may take for its weights and KV "
                                              "cache (the trainer shares the GPU), in (0, 1]", range="> 0 and <= 1")
    kv_cache_gib: float | None = knob(None, "KV-cache memory in GiB; null: 1 on CPU, what gpu_memory_utilization "
                                            "leaves on GPU", range="> 0", null="for the default")
    tensor_parallel_size: int = knob(1, "GPUs the engine shards the model over", range=">= 1")
    enforce_eager: bool = knob(True, "run vLLM's model eagerly: the engine starts in seconds; false compiles it "
                                     "(CPU, float32: ~40 s more at start, generation ~40% faster; docs/vllm.md)")
    max_model_len: int | None = knob(None, "longest prompt + response the engine serves; null: the model's "
                                           "max_position_embeddings", range=">= 2", null="for the model's own")
    weight_sync: str = knob("auto", "how weights reach the engine after each step: auto (ipc when the policy is on "
                                    "a GPU, else file) | file (a safetensors file in /dev/shm, reloaded in place) | "
                                    "ipc (vLLM's CUDA-IPC weight transfer; untested)", choices=("auto", "file", "ipc"))
    start_timeout_s: float = knob(600.0, "seconds the engine may take to start before the run stops with its log",
                                  range="> 0")
    call_timeout_s: float = knob(3600.0, "seconds one engine request (a step's generation, an evaluation, a weight "
                                         "sync) may take: past it the engine counts as hung, is killed, and the run "
                                         "stops with its log and the last checkpoint, as for a dead engine",
                                         range="> 0")
    extra: dict[str, Any] = knob(help="more vllm.LLM(...) keyword arguments, passed as they are "
                                      "(e.g. rollout.vllm.extra={max_num_seqs: 128})", factory=dict)


# Which rollout engine to pick on a GPU, and what each costs (`literl config --explain`; docs/speed.md, "GPU
# decode"). The figures behind it: results/benchmarks/2026-11-26_h200_gpu-decode.md.
ENGINE_CHOICE_ON_GPU = (
    "Rollout engine on a GPU (rollout.engine):",
    "  vllm  where vLLM is installed (./run.sh vllm-setup installs the CUDA build) and the model is large: engines",
    "        like it sample 6-14x faster than HF generate (published figures); literl's vLLM engine is not yet",
    "        measured on a GPU. Costs: a second process holding its own weights and KV cache (rollout.vllm.",
    "        gpu_memory_utilization, default half the GPU), a weight sync after every optimizer step, no forward",
    "        record for the update to replay.",
    "  native literl's own engine, the default and the choice without vLLM: no second process, no weight sync (it",
    "        samples from the policy module itself), MoE routes recorded for R3. On CUDA it decodes with the",
    "        fixed-shape step captured as CUDA graphs per batch bucket (rollout.decode=auto), several times faster",
    "        than HF generate (rollout.compile=true: faster still, after a one-off compile; measured:",
    "        results/benchmarks/2026-11-26_h200_gpu-decode.md). Costs: graphs captured once per batch size (about",
    "        a second), the KV cache kept between steps while the graphs are held.",
)


@dataclass
class RolloutConfig:
    engine: str = knob("native", "rollout engine: native (literl's own, in the trainer's process; 'hf', its old "
                                 "name, is read as native) | vllm (vLLM in its own process and environment, settings "
                                 "in rollout.vllm; docs/vllm.md). Which to pick on a GPU: the 'Rollout engine on a "
                                 "GPU' notes at the end of --explain", choices=("native", "vllm"))
    prompts_per_step: int = knob(32, "P: prompts per rollout batch", range=">= 1")
    group_size: int = knob(8, "G: samples per prompt", range=">= 1")
    temperature: float | None = knob(None, "sampling temperature, > 0 (the log-probs of every policy use it too); "
                                           "null: the profile's (testbed 1.0, real 0.99)",
                                           range="> 0", null="for the profile's",
                                           hint="the log-probs are divided by it; use a small value such as 0.1 "
                                                "for near-greedy sampling")
    top_p: float | None = knob(None, "nucleus sampling threshold in (0, 1]; 1.0 disables it; null: the profile's "
                                     "(testbed 1.0, real 0.99)",
                                     range="> 0 and <= 1", null="for the profile's",
                                     hint="1.0 disables nucleus sampling")
    top_k: int | None = knob(None, "top-k sampling; 0 disables it; null: the profile's (testbed 0, real 100)",
                             range=">= 0", null="for the profile's", hint="0 disables top-k sampling")
    max_new_tokens: int | None = knob(None, "generation cap; a response that reaches it without EOS is truncated; "
                                            "null: the profile's (testbed 64; real 8192, capped by the model's "
                                            "context)", range=">= 1", null="for the profile's")
    dtype: str = knob("float32", "rollout precision: float32 | bfloat16 | float8_e4m3 | int4. bfloat16 makes a "
                                 "real training–inference mismatch to study IS corrections on CPU; float8_e4m3 rounds "
                                 "the engine's projection weights to FP8 E4M3 (a scale per output channel) and "
                                 "computes in bfloat16, the MiniRL paper's FP8-inference stress test; int4 rounds them "
                                 "to 4-bit integers (a scale per output channel and 32 inputs), a ~10x larger gap "
                                 "(literl/model/quantize.py)", choices=("float32", "bfloat16", "float8_e4m3", "int4"))
    max_rounds: int = knob(1, "sampling rounds per step; >1 lets a group filter (dynamic sampling) refill "
                              "the batch", range=f">= 1 and <= {MAX_ROUNDS}",
                           hint="1 = no resampling; dynamic sampling needs a few rounds (DAPO: up to 10), and 20 "
                                "rounds in a row that keep no group stop the run long before the limit")
    decode: str = knob("auto", "decode route (engine=native): auto (on a model the runtime decodes: static on CPU, "
                               "fixed on CUDA; else dynamic) | static (attend over the written cache columns) | "
                               "fixed (one shape per batch size and 64-column width, the not yet written columns "
                               "masked; on CUDA captured as CUDA graphs per batch bucket) | dynamic (the model's "
                               "own forward with a growing cache); docs/speed.md",
                               choices=("auto", "static", "fixed", "dynamic"))
    compile: bool = knob(False, "torch.compile the static or fixed decode step with its sampling, and the prefill "
                                "(~20-40 s once, printed; rollout ~25% faster on the CPU speed benchmark, "
                                "docs/speed.md; for long runs)")
    vllm: VllmConfig = knob(help="the vLLM engine (rollout.engine=vllm); rollout.dtype is its precision",
                            factory=VllmConfig)
    max_staleness: int = knob(0, "k, asynchronous RL with bounded staleness (docs/async.md): 0 = the synchronous "
                                 "loop (collect, update, sync); k >= 1: the engine generates the next batches on "
                                 "its own copy of the weights while the trainer updates, batch s under policy "
                                 "version max(0, s-k) (a fixed schedule, so a seed repeats its run), every token "
                                 "tagged with its version; at most k batches are held ahead of the trainer",
                                 range=f">= 0 and <= {MAX_STALENESS}",
                                 hint="0: the synchronous loop; the engine holds k + 1 copies of the weights and logs "
                                      "k + 1 staleness metrics a step, and studies use 1 to 8")
    partial_rollouts: bool = knob(False, "with max_staleness >= 1 and the native engine: a response continues under the "
                                         "next policy version from decode step max_new_tokens // 2 on (in-flight "
                                         "weight update, PipelineRL-style; each token keeps the version that "
                                         "sampled it); docs/async.md")
    async_engine_threads: int | None = knob(None, "with max_staleness >= 1, the engine and the update run at once and "
                                                  "split trainer.threads: the engine's torch threads (the native "
                                                  "engine's generation thread, or the vllm engine's process), the "
                                                  "update keeps the rest (at least 1); null: half of "
                                                  "trainer.threads, at least 1",
                                                  range=">= 1", null="for half of trainer.threads")
    # Multi-turn tool use (docs/multiturn.md): active when rollout.tools or rollout.environment is set; otherwise the
    # single-turn rollout runs exactly as without these keys.
    tools: list[str] = knob(help="multi-turn tool use: tool functions as import paths 'module:function', e.g. "
                                 "[literl.tools:calculator] or [literl.tools:python, my_module:lookup]; [] (and no "
                                 "rollout.environment): the single-turn rollout. With tools or an environment, "
                                 "rollout.max_new_tokens bounds a trajectory's whole response: sampled, observation "
                                 "and turn-boundary tokens together", factory=list)
    environment: str | None = knob(None, "multi-turn environment: null (with rollout.tools: 'tools', which answers "
                                         "each tool call with its result and ends on a turn without calls) | a "
                                         "registered name | 'module:Class' with reset(problem) and step(turn) (your "
                                         "own module: --import it); docs/multiturn.md")
    max_turns: int = knob(4, "multi-turn: the most model turns in a trajectory (it ends 'max_turns' after that)",
                          range=">= 1", hint="1: one turn, then the trajectory ends")
    max_turn_tokens: int | None = knob(None, "multi-turn: the most tokens one turn samples; null: "
                                             "rollout.max_new_tokens", range=">= 1", null="for rollout.max_new_tokens")
    max_tool_response_tokens: int | None = knob(256, "multi-turn: an observation longer than this many tokens is cut "
                                                     "and ends with a marker saying how much was cut; null: never "
                                                     "cut", range=">= 1", null="to never cut")
    model_family: str = knob("auto", "multi-turn: how tool calls are written and turns end: auto (hermes when the "
                                     "tokenizer has a chat template, else raw) | hermes | qwen | qwen2.5 | qwen3 | raw "
                                     "(literl/tools/families.py)")
    tool_timeout_s: float = knob(30.0, "multi-turn: seconds a batch of tool calls may take; a call past it is "
                                       "answered with a timeout observation", range="> 0")


@dataclass
class RewardFnSpec:
    fn: str = knob("literl.rewards.math_answer:math_accuracy",
                   "import path `package.module:function` of a reward function (literl, TRL or verl style)")
    weight: float = knob(1.0, "weight of this function in the summed score")
    convention: str = knob("auto", "how it is called: auto (read off its signature) | literl f(response, example) | "
                                   "trl f(prompts, completions, **columns) -> list | verl compute_score(data_source, "
                                   "solution_str, ground_truth, extra_info); literl/rewards/conventions.py",
                                   choices=("auto", "literl", "trl", "verl"))


@dataclass
class RewardConfig:
    fns: list[RewardFnSpec] = knob(help="reward functions, summed with weights; the first one decides "
                                        "accuracy (output >= 0.5)", factory=lambda: [RewardFnSpec()])
    timeout_s: float = knob(5.0, "wall-clock bound per reward check; a check that runs over scores 0", range="> 0")
    step_timeout_s: float = knob(120.0, "wall-clock budget for all reward checks of one step; once spent, the "
                                        "remaining slow checks score 0 and count as timeouts (a collapsed policy "
                                        "repeating hostile answers cannot stall a step for minutes)",
                                        range=">= timeout_s", hint="the step's budget holds at least one full check")
    max_failed_batches: int = knob(3, "stop the run (after saving the last complete step) when this many scored "
                                      "batches in a row (one per step, more when dynamic sampling resamples) had "
                                      "every reward call fail or time out: no signal to learn from; 0: never stop",
                                      range=">= 0", hint="0: never stop")


@dataclass
class AlgorithmConfig:
    advantage: TrickSpec = knob(help="advantage estimator", factory=lambda: trick("grpo"))
    policy_loss: TrickSpec = knob(help="per-token policy loss", factory=lambda: trick("ppo_clip"))
    aggregation: TrickSpec = knob(help="how token losses are weighted into the step loss",
                                  factory=lambda: trick("seq_mean_token_mean"))
    aggregation_normaliser: str = knob(
        "global", "global: the aggregation's counts are taken over the whole optimizer step, so the loss is exact "
                  "whatever the micro-batch split; local: over each micro-batch, ÷ #micro-batches (verl's legacy "
                  "actor, TRL's bnpo; not exact, for reproducing them)", choices=("global", "local"))
    is_correction: TrickSpec = knob(help="training–inference importance-sampling correction",
                                    factory=lambda: trick("none"))
    kl: TrickSpec = knob(help="KL estimator to the reference policy", factory=lambda: trick("k3"))
    kl_coef: float = knob(0.0, "β: KL weight, >= 0; 0 disables the KL term and the reference model",
                          range=">= 0", hint="0 disables the KL term")
    kl_in_reward: bool = knob(False, "true: −β·KL(old‖ref) is a per-token reward penalty; false: β·KL(θ‖ref) "
                                     "is a loss term")
    entropy_coef: float = knob(0.0, "entropy bonus weight, >= 0 (loss −= coef · aggregated entropy)",
                               range=">= 0", hint="0 disables the entropy bonus")
    loss_masks: dict[str, dict[str, Any]] = knob(
        help="loss masks, name → params (e.g. overlong: {}). A map given in a YAML file or as "
             "algorithm.loss_masks={...} replaces the preset's; algorithm.loss_masks.<name>.<param>=v merges "
             "into one entry; algorithm.loss_masks.<name>=null (or ~algorithm.loss_masks.<name>) removes it",
        factory=dict)
    policy_masks: dict[str, dict[str, Any]] = knob(
        help="masks on the policy-loss term computed from the current policy each micro-batch, name → params "
             "(e.g. opsm: {delta: 0.5}, high_entropy: {top_ratio: 0.2}); masked tokens stay in the denominators. "
             "Edited like loss_masks: algorithm.policy_masks.<name>.<param>=v adds or merges one entry, "
             "algorithm.policy_masks.<name>=null removes it",
        factory=dict)
    reward_shaping: dict[str, dict[str, Any]] = knob(
        help="reward transforms applied in order, name → params (e.g. rescale: {low: -1}). A map given in a "
             "YAML file or as algorithm.reward_shaping={...} replaces the preset's ({} clears it); "
             "algorithm.reward_shaping.<name>.<param>=v merges into one entry; "
             "algorithm.reward_shaping.<name>=null (or ~algorithm.reward_shaping.<name>) removes it",
        factory=dict)
    group_filter: TrickSpec = knob(help="which groups enter the batch (dynamic sampling)",
                                   factory=lambda: trick("keep_all"))
    bypass_mode: bool = knob(False, "use the rollout engine's log-probs as old_logp (no recompute pass)")
    routing_replay: str = knob(
        "none", "MoE Routing Replay (algorithms.md §6): none | r2 (every update forward replays the experts the "
                "trainer chose with θ_old in the old-log-prob pass) | r3 (the old-log-prob pass and every update "
                "forward replay the experts the inference engine chose while sampling). The gate weights are "
                "recomputed from the current router logits at the replayed experts, so the router keeps its gradient; "
                "the reference model never replays. Needs a mixture-of-experts model", choices=("none", "r2", "r3"))
    router_aux_loss_coef: float = knob(
        0.0, "weight of the MoE router's load-balancing loss (Switch Transformer: E·Σ_e f_e·P_e per MoE layer, "
             "averaged over layers) added to the RL loss; 0 (default) turns it off, as RL engines do (a model's own "
             "router_aux_loss_coef from pretraining is not used)",
             range=">= 0", hint="0 turns the MoE load-balancing loss off")


@dataclass
class OptimConfig:
    lr: float | None = knob(None, "AdamW learning rate; null: the profile's (real: 1e-6, the LitePPO paper's value; "
                                  "testbed: 5e-5, tuned on the testbed)", range="> 0", null="for the model's default")
    weight_decay: float = knob(0.0, "AdamW weight decay", range=">= 0")
    betas: list[float] = knob(help="AdamW betas: two numbers in [0, 1)", factory=lambda: [0.9, 0.999])
    eps: float = knob(1e-8, "AdamW epsilon", range="> 0")
    max_grad_norm: float = knob(1.0, "gradient-norm clip; 0 disables it", range=">= 0", hint="0 disables clipping")
    warmup_steps: int = knob(0, "linear learning-rate warm-up, in optimizer steps", range=">= 0")
    schedule: str = knob("constant", "learning-rate schedule after warm-up: constant | linear | cosine",
                         choices=("constant", "linear", "cosine"))


@dataclass
class TrainerConfig:
    steps: int = knob(100, "rollout batches to train on", range=">= 0")
    minibatches: int = knob(1, "optimizer steps per pass over a rollout batch (1: on-policy; >1: off-policy "
                               "updates)",
                               range=">= 1 and <= rollout.prompts_per_step", hint="mini-batches hold whole groups")
    epochs: int = knob(1, "passes over each rollout batch (PPO epochs: verl's ppo_epochs, TRL's num_iterations): "
                          "each pass takes the same mini-batches again, so a rollout batch gives minibatches x "
                          "epochs optimizer steps and every pass after the first is off-policy",
                          range=">= 1", hint="1: each rollout batch is trained on once")
    micro_batch_tokens: Any = knob("auto", "max padded tokens per forward/backward (real tokens where rows are "
                                           "packed: CUDA), the gradient accumulation unit (exactness does not "
                                           "depend on it): a number, or auto (16384 on CPU; on CUDA sized from the "
                                           "free GPU memory at the first update, and 3/4 of that after a "
                                           "micro-batch runs out of memory)",
                                           range=">= 1", choices=("auto",),
                                           hint="16384 on CPU, sized from free GPU memory on CUDA")
    output_dir: str | None = knob(None, "run directory; null: runs/<preset>-<timestamp>")
    resume: bool = knob(False, "continue the run in output_dir from its last checkpoint")
    save_every: int = knob(0, "checkpoint every N steps (0: by time only, see save_every_minutes; a checkpoint is "
                              "also written at the end, on Ctrl-C/SIGTERM and, best effort, when the loop fails)",
                              range=">= 0", hint="0: save by time only, trainer.save_every_minutes")
    save_every_minutes: float = knob(30.0, "checkpoint when this many minutes have passed since the last one "
                                           "(0: off); bounds the work a crash can lose", range=">= 0", hint="0: off")
    max_non_finite_steps: int = knob(3, "optimizer steps with a NaN/inf loss or gradient are skipped; this many "
                                        "in a row stop the run with an error (0: never stop)",
                                        range=">= 0", hint="0: never stop on non-finite steps")
    keep_checkpoints: int = knob(2, "how many recent checkpoints to keep (0: keep all)",
                                 range=">= 0", hint="0: keep all")
    log_samples: int = knob(4, "sample responses written to samples.jsonl per step", range=">= 0")
    trackers: list[str] = knob(help="extra metric sinks: tensorboard, wandb", factory=list,
                               choices=("tensorboard", "wandb"))
    threads: int | None = knob(None, "torch CPU threads, >= 1; null: the CPUs this process may use (its "
                                     "affinity mask: taskset, cgroup cpusets, Slurm), at most torch's default "
                                     "(physical cores, or OMP_NUM_THREADS)",
                                     range=">= 1", null="for the CPUs this process may use")
    recompute_old_logp: str = knob("auto", "auto: reuse the update's own detached log-probs as old_logp when "
                                           "that is exact (one on-policy mini-batch, no IS correction); "
                                           "always: run the recompute pass every step (bypass_mode never runs "
                                           "it: old_logp is the rollout's)", choices=("auto", "always"))
    device: str = knob("auto", "auto | cpu | cuda", choices=("auto", "cpu", "cuda"))
    compile: bool = knob(False, "torch.compile the training forward's decoder layers (Llama/Qwen-style models; "
                                "tens of seconds once; CPU: less update time on the speed benchmark; CUDA's "
                                "packed route: each layer with its attention one graph, and the LM head's tiles, "
                                "compiled: the update's element-wise work fused; figures in results/benchmarks/, "
                                "docs/speed.md)")
    packed_attention: str = knob("auto", "the update's packed route (whole rows as one token stream, no padding; "
                                         "literl/model/packing.py): auto (CUDA: the first of varlen, padded that "
                                         "matches the model's own forward; CPU: rows are not packed) | off | "
                                         "varlen | padded | document_mask (always pack, with that attention kernel)",
                                         choices=("auto", "off", "varlen", "padded", "document_mask"))
    replay_max_gib: float = knob(2.0, "memory (GiB) the rollout may use to keep its decode's matmul outputs, so "
                                      "that an update with the rollout's own weights (on-policy, engine sampling "
                                      "from the policy itself) replays them instead of recomputing its forward "
                                      "matmuls (literl/model/record.py); 0 turns this off",
                                      range=">= 0", hint="0 turns replay off")
    retain_host_memory: bool = knob(True, "on CPU with glibc: keep freed memory in the process for the next "
                                          "step instead of returning it to the OS (no page faults on each "
                                          "step's large tensors; ~2-7% faster steps, resident memory stays "
                                          "at its peak; literl/run/host_memory.py)")
    progress: bool = knob(True, "show a progress bar")
    log_every: int = knob(1, "when the output is not a terminal (a log file) or progress=false: a plain line "
                             "with the elapsed time and ETA every N steps (and at the first and last)",
                             range=">= 1", hint="a log line every N steps")


@dataclass
class EvalConfig:
    every: int = knob(25, "held-out evaluation every N steps, besides before and after training (0: only those)",
                      range=">= 0", hint="0: evaluate only before and after training")
    benchmarks: list[str] | None = knob(None, "benchmarks to evaluate on ('testbed' is the testbed's held-out "
                                              "split); null: the profile's (testbed: [testbed]; real: math500, "
                                              "aime24, aime25, amc23, minerva, olympiadbench from data.dir)")
    samples: int = knob(4, "samples per problem (accuracy is their average)", range=">= 1")
    temperature: float | None = knob(None, "sampling temperature, > 0; null: rollout.temperature (greedy "
                                             "accuracy comes from eval.greedy)",
                                             range="> 0", null="for rollout.temperature",
                                             hint="greedy accuracy is reported separately by eval.greedy=true")
    greedy: bool = knob(True, "also report greedy accuracy")
    limit: int | None = knob(200, "problems per benchmark (null: all)", range=">= 1", null="for every problem")
    max_new_tokens: int | None = knob(None, "null: rollout.max_new_tokens",
                                      range=">= 1", null="for rollout.max_new_tokens")
    before: bool = knob(True, "evaluate before the first step (the 'before' of the summary)")
    policy: str = knob("engine", "which policy the held-out evaluation samples: engine (the rollout engine's, what "
                                 "is deployed: with rollout.dtype=float8_e4m3/int4/bfloat16 its rounded copy) | "
                                 "trainer (literl's engine over the trainer's own weights, at their precision): where "
                                 "engine and trainer differ, the two can rank IS corrections differently "
                                 "(results/findings/finding_g.md)", choices=("engine", "trainer"))


@dataclass
class ClusterConfig:
    address: str | None = knob(None, "null: one process (rollout and update in the trainer's process); local: start a "
                                     "Ray cluster on this machine; else the address of a running Ray cluster, as "
                                     "ray.init takes it (auto, ray://head:10001, head:6379). Needs pip install "
                                     "'literl[ray]' (./run.sh installs it on first use)")
    trainer_ranks: int = knob(1, "trainer ranks: Ray actors forming one torch.distributed group (gloo on CPU, NCCL "
                                 "on GPU) that train with FSDP2, micro-batches spread over them", range=">= 1")
    rollout_workers: int = knob(1, "rollout workers: Ray actors each holding a rollout engine; a step's prompt groups "
                                   "are spread over them (a group never spans two)", range=">= 1")
    cpus_per_worker: float = knob(1.0, "CPUs Ray reserves for each trainer rank and rollout worker (and the torch "
                                       "threads each uses, rounded up)", range="> 0")
    gpus_per_worker: float = knob(0.0, "GPUs Ray reserves for each trainer rank and rollout worker (0: CPU)",
                                  range=">= 0", hint="0: CPU")
    sync_bucket_mb: float = knob(64.0, "weight sync after each optimizer step moves the weights in buckets of at "
                                       "most this many MB (the extra memory it needs on each side)", range="> 0")


@dataclass
class Config:
    seed: int = knob(0, "seed for sampling, data order and mini-batch shuffling (0 to 2^32 - 1)",
                     range=f">= 0 and <= {MAX_SEED}", hint="a run's seed is a 32-bit integer")
    preset: str | None = knob(None, "the preset this config started from (informational)")
    imports: list[str] = knob(help="modules (or .py files) imported before the config is checked, so the tricks and "
                                   "reward functions they register are usable by name; --import adds to it "
                                   "(literl/config/plugins.py, docs/custom-tricks.md)", factory=list)
    model: ModelConfig = knob(help="policy model", factory=ModelConfig)
    data: DataConfig = knob(help="training problems", factory=DataConfig)
    rollout: RolloutConfig = knob(help="sampling", factory=RolloutConfig)
    reward: RewardConfig = knob(help="reward functions", factory=RewardConfig)
    algorithm: AlgorithmConfig = knob(help="the RL objective: one switch per trick", factory=AlgorithmConfig)
    optim: OptimConfig = knob(help="optimizer", factory=OptimConfig)
    trainer: TrainerConfig = knob(help="loop, checkpoints, logging", factory=TrainerConfig)
    eval: EvalConfig = knob(help="held-out evaluation", factory=EvalConfig)
    cluster: ClusterConfig = knob(help="scale out on Ray: rollout workers and FSDP2 trainer ranks (docs/scaling.md)",
                                  factory=ClusterConfig)


def leaf_keys(node, prefix: str = "") -> set[str]:
    """Every dotted key of the tree under `node` (a list's items are not keys of their own)."""
    keys = set()
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, TrickSpec):
            keys |= leaf_keys(value, f"{prefix}{f.name}.")
        else:
            keys.add(f"{prefix}{f.name}")
    return keys


def _parse_knob_ranges(root: Config) -> dict[tuple[type, str], list]:
    """Each knob's declared range, parsed: (section class, field name) -> clauses. An operand is a number, a key
    of the same section or a full key; a typo fails when this module is imported, as a trick's range does."""
    from literl.algorithm.registry import parse_range

    keys, parsed = leaf_keys(root), {}

    def walk(node, prefix: str) -> None:
        siblings = {f.name for f in dataclasses.fields(node)}
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            if dataclasses.is_dataclass(value) and not isinstance(value, TrickSpec):
                walk(value, f"{prefix}{f.name}.")
            elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
                walk(value[0], f"{prefix}{f.name}.0.")
            if f.metadata.get("range"):
                parsed[(type(node), f.name)] = parse_range(f.metadata["range"], f"{prefix}{f.name}",
                                                           lambda op: op in siblings or op in keys)

    walk(root, "")
    return parsed


KNOB_RANGES = _parse_knob_ranges(Config())
KNOB_KEYS = frozenset(leaf_keys(Config()))

__all__ = ["Config", "ConfigError", "TrickSpec", "trick", "ModelConfig", "LoraSpec", "DataConfig", "RolloutConfig",
           "VllmConfig", "RewardConfig", "RewardFnSpec", "AlgorithmConfig", "OptimConfig", "TrainerConfig",
           "EvalConfig", "ClusterConfig"]
