"""The tricks library: one file and one registry per axis of variation.

Every entry is a pure function on tensors: tensors positional, parameters keyword-only with paper
defaults, formula and `Refs:` in the docstring, registered under its own name. Only `literl.algorithm.objective`
composes them; nothing outside a registry compares a trick name to a string.

Axis contracts (shape suffixes as in `literl.algorithm.batch`):

    advantages      (rewards_B, group_B, mask_BT, token_rewards_BT, *, ...) -> adv_BT
    policy_losses   (logp_BT, old_logp_BT, rollout_logp_BT, adv_BT, mask_BT, *, ...) -> (loss_BT, metrics)
    aggregation     (mask_BT, group_B, *, ...) -> (numerator_BT, denominator)     weight = numerator / Σdenominator
    kl              (logp_BT, ref_logp_BT, *, ...) -> kl_BT
    is_correction   (old_logp_BT, rollout_logp_BT, mask_BT, *, ...) -> (weight_BT, keep_BT, metrics)
    loss_masks      (mask_BT, truncated_B, *, ...) -> keep_BT
    policy_masks    (logp_BT, old_logp_BT, rollout_logp_BT, adv_BT, mask_BT, entropy_BT, *, ...) -> (gate_BT, metrics)
    reward_shaping  (rewards_B, lengths_B, truncated_B, *, ...) -> rewards_B
    group_filters   (correct_B, rewards_B, group_B, *, ...) -> keep_B

How a trick goes with the other axes and the rest of the config (GSPO is defined with seq_mean_token_mean
aggregation, MiniRL brings its own IS correction) is declared at its registration too (`compatibility=`,
`literl.algorithm.registry`): a new trick is its own file and its test, and `literl.config.rules.validate` walks the
declarations.

A trick that needs more of the step than its positional tensors declares keyword `inputs` at registration
(`literl.algorithm.registry`), which the objective supplies at each call: `entropy_BT` (the current policy's entropy,
detached), `generator` (a torch.Generator seeded from the run, for a random selection).
"""

from literl.algorithm.registry import Registry, link_axes

ADVANTAGES = Registry("advantage")
POLICY_LOSSES = Registry("policy_loss")
AGGREGATIONS = Registry("aggregation")
KL_ESTIMATORS = Registry("kl")
IS_CORRECTIONS = Registry("is_correction")
LOSS_MASKS = Registry("loss_mask")
POLICY_MASKS = Registry("policy_mask")
REWARD_SHAPING = Registry("reward_shaping")
GROUP_FILTERS = Registry("group_filter")

# Importing the axis modules fills the registries above.
from literl.algorithm.tricks import (  # noqa: E402,F401
    advantages,
    aggregation,
    group_filters,
    is_correction,
    kl,
    loss_masks,
    policy_losses,
    policy_masks,
    reward_shaping,
)

ALL = {
    "advantage": ADVANTAGES,
    "policy_loss": POLICY_LOSSES,
    "aggregation": AGGREGATIONS,
    "kl": KL_ESTIMATORS,
    "is_correction": IS_CORRECTIONS,
    "loss_mask": LOSS_MASKS,
    "policy_mask": POLICY_MASKS,
    "reward_shaping": REWARD_SHAPING,
    "group_filter": GROUP_FILTERS,
}
# The compatibility declarations name tricks of other axes: checked now that every axis is filled.
link_axes(ALL)
