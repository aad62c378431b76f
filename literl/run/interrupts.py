"""A stop request (Ctrl-C, SIGTERM) that arrives in the middle of a step: the rollout side abandons the step it is
collecting with `StepStopped`, and the loop saves the last complete step instead of waiting for this one."""

from __future__ import annotations


class StepStopped(Exception):
    """A stop was requested while the step collected its batch; the step is abandoned before anything trained on
    it."""
