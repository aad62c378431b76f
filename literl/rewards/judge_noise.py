"""A noisy judge's error term for `reward.fns`: a score in [0, 1) that depends on the response's text only by chance.

    judge_noise(response, example) = blake2b(problem ∥ response) as a fraction in [0, 1)        (uniform over texts)

A learned reward model or an LLM judge scores two equally correct responses that differ in wording a little
differently, for reasons unrelated to their quality. This term is that error and nothing else: deterministic (one
text of one problem always scores the same, as a judge at temperature 0 does; a policy that writes one string for
all its samples of a problem gets one score), uniform over distinct texts (mean 0.5, std 1/√12 ≈ 0.289), unrelated
to correctness. Beside the correctness check with a small weight (`reward.fns=[{fn: ...math_accuracy}, {fn:
literl.rewards.judge_noise:judge_noise, weight: 0.1}]`), a group whose members are all correct has a reward std
of ~0.029 from the noise alone (`groups/small_std_frac`) — what a group-std normalisation divides by and turns
into advantages of full size (algorithms.md §1.1; the regime of `finding_c`'s third and fourth versions,
docs/testbed.md).
"""

from __future__ import annotations

import hashlib


def judge_noise(response: str, example: dict | None = None) -> float:
    """The first 8 bytes of blake2b(problem text ∥ NUL ∥ response) over 2⁶⁴: in [0, 1), the same in every process
    (not Python's salted `hash`). Without a problem record the response alone is hashed."""
    problem = "" if example is None else str(example.get("problem", ""))
    digest = hashlib.blake2b(f"{problem}\0{response}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0 ** 64
