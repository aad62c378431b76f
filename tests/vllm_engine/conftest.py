"""One real vLLM engine for the whole test session (vLLM in its own process and environment, `.venv-vllm`, which
`./run.sh test` sets up). Where that environment cannot be had, the tests that need it skip and say why."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import build_tiny_qwen3

# Token ids that end a response in these tests. The model's own config says EOS is 1: the engine must stop at
# the ids literl gives it, not at the model's.
EOS_IDS = (5, 7)
PAD_ID = 0


def vllm_tiny_qwen3(seed: int = 0):
    """The tiny Qwen3 of tests/conftest.py with head size 32: vLLM's CPU attention has no kernel for 16."""
    return build_tiny_qwen3(seed, hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                            intermediate_size=128)


@pytest.fixture(scope="session")
def vllm_python() -> str:
    from literl.rollout.vllm_process import VllmEngineError, engine_python

    try:
        return engine_python()
    except VllmEngineError as error:
        pytest.skip(f"no vLLM engine environment: {error}")


class SessionEngine:
    """The session's engine, the trainer-side state seen around its start, and the weights it was started from."""

    def __init__(self, python: str):
        from literl.rollout.vllm_engine import VllmEngine

        self.model = vllm_tiny_qwen3().eval()
        self.threads_before = torch.get_num_threads()
        self.rng_before = torch.get_rng_state()
        self.engine = VllmEngine(self.model, eos_token_ids=EOS_IDS, pad_id=PAD_ID, dtype=torch.float32,
                                 python=python, kv_cache_gib=0.25)
        self.threads_after = torch.get_num_threads()
        self.rng_after = torch.get_rng_state()


@pytest.fixture(scope="session")
def session_engine(vllm_python):
    session = SessionEngine(vllm_python)
    yield session
    session.engine.close()
