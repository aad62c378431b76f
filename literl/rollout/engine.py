"""The rollout engine interface. The trainer, the collector and evaluation only ever see this.

An engine samples responses for token-id prompts and reports, per response token, the log-probability
the sampler used (`rollout_logp`, from temperature-scaled logits over the full vocabulary, the same
definition the trainer uses for `old_logp`, so that with identical numerics the two agree exactly).
Later engines (vLLM, a Ray actor) implement the same protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, Sequence

import torch

if TYPE_CHECKING:
    from literl.model.record import ForwardRecord


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                 # 0: no top-k filter
    max_new_tokens: int = 64
    greedy: bool = False           # argmax decoding (temperature is still used for the reported log-probs)
    # Keep what the policy's forward computed for an on-policy update to replay (`Generation.forward_record`): the
    # collector asks it where the update may replay (trainer.replay_max_gib > 0); an engine without a recorder, or
    # one that cannot record, returns none. Evaluation never asks.
    keep_forward: bool = False
    # Ids that end a response besides the engine's own EOS ids, kept as the response's last token as an EOS is: a
    # multi-turn turn stops at its tool call's closing token (`literl.multiturn.engine_turns`). () for single turns.
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (got {self.temperature}); use greedy=True for argmax decoding")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (got {self.top_k}); 0 disables it")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1 (got {self.max_new_tokens})")


@dataclass
class Generation:
    """Responses for a list of prompts, in the order the prompts were given.

    response_ids_BT  long, right-padded with pad_id after each response's end
    mask_BT          bool, True on generated tokens (the EOS token included)
    rollout_logp_BT  float32, log μ of each generated token (0 on padding)
    truncated_B      bool, True when max_new_tokens stopped the response before an EOS
    extras           per-token tensors the engine recorded (e.g. MoE routes), keyed with shape suffixes
    forward_record   what the decode steps computed, for an on-policy update to replay (`SamplingParams.
                     keep_forward`, `literl.model.record`); None when the engine kept none
    """

    response_ids_BT: torch.Tensor
    mask_BT: torch.Tensor
    rollout_logp_BT: torch.Tensor
    truncated_B: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    forward_record: "ForwardRecord | None" = None

    @staticmethod
    def empty() -> "Generation":
        """The answer to an empty list of prompts (one padding column, so shapes stay 2-D)."""
        none = torch.zeros(0, 1)
        return Generation(none.long(), none.bool(), none, torch.zeros(0, dtype=torch.bool))


def check_prompts(prompts) -> None:
    """What every engine refuses: a prompt without tokens (nothing to condition the first token on)."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")


class Engine(Protocol):
    """What a rollout engine provides."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 *, rng: torch.Generator | None = None) -> Generation:
        """Sample one response per prompt (repeat a prompt G times for a group), as `params` say (their
        `keep_forward` asks for the forward record an on-policy update replays)."""
        ...

    def sync_weights(self, policy: torch.nn.Module) -> dict[str, float] | None:
        """Make the engine sample from `policy`'s current weights (a no-op when it shares them); an engine with its
        own copy may return metrics of the sync (`sync/bytes`, `sync/seconds`)."""
        ...
