"""The ways a training step can end before it trains: raised on the rollout side (`literl.rollout.collector`, the
asynchronous producer), handled on the training side (`literl.training.trainer`, the train command). They live
here because rollout and training never import each other."""

from __future__ import annotations


class GroupFilterStalled(RuntimeError):
    """The group filter kept no group in many rounds in a row: the step would resample to no end."""


class StepStopped(Exception):
    """A stop was requested (Ctrl-C, SIGTERM) while the step resampled or waited for its batch; the step is abandoned
    before anything trained on it."""
