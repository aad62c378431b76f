"""The vLLM engine against the trainer's own numbers, on a real engine (no mocks): the sampled tokens'
log-probs equal the trainer's (`PolicyForward.token_logprobs`) for the same model in float32, a seed repeats its
tokens, a weight sync after an optimizer step restores parity (stale prefix cache, tied head), and the trainer's
process keeps its threads and RNG."""

from __future__ import annotations

import copy
import os

import pytest
import torch

from literl.model import PolicyForward
from literl.rollout.engine import SamplingParams
from tests.vllm_engine.conftest import EOS_IDS, PAD_ID, vllm_tiny_qwen3

TOLERANCE = 1e-4
# Longer than one KV block, so that vLLM's prefix cache keeps blocks of it between calls.
LONG_PROMPT = [2] + [10 + (i * 7) % 80 for i in range(199)]


def _prompts(group: int = 4) -> list[list[int]]:
    """Three prompts interleaved (A B C A B C ...), so rows of one prompt are not neighbours."""
    distinct = [[2, 11, 12, 13], [2, 40, 41], [2] + list(range(20, 60))]
    return [p for _ in range(group) for p in distinct]


def trainer_logprobs(model, prompts, generation, temperature: float) -> torch.Tensor:
    """log π of each generated token as the trainer computes it (prompt then response in one row)."""
    ids_BT, mask_BT = generation.response_ids_BT, generation.mask_BT
    B, T = ids_BT.shape
    lengths_B = mask_BT.sum(-1)
    prompt_len_B = torch.tensor([len(p) for p in prompts])
    tokens_BL = torch.full((B, int((prompt_len_B + lengths_B).max())), PAD_ID, dtype=torch.long)
    for b, prompt in enumerate(prompts):
        tokens_BL[b, :len(prompt)] = torch.tensor(prompt)
        tokens_BL[b, len(prompt):len(prompt) + lengths_B[b]] = ids_BT[b, :lengths_B[b]]
    with torch.no_grad():
        logp_BT, _ = PolicyForward(model, temperature=temperature).token_logprobs(tokens_BL, prompt_len_B, T,
                                                                                  mask_BT=mask_BT)
    return logp_BT


def max_gap(model, prompts, generation, temperature: float) -> float:
    ours = trainer_logprobs(model, prompts, generation, temperature)
    mask = generation.mask_BT
    return float((ours[mask] - generation.rollout_logp_BT[mask]).abs().max())


@pytest.mark.parametrize("temperature, top_p, top_k", [(1.0, 1.0, 0), (0.7, 0.9, 20)])
def test_sampled_token_logprobs_equal_the_trainers(session_engine, temperature, top_p, top_k):
    """literl's rollout_logp is log softmax(logits / T) of the sampled token over the full vocabulary, also under
    top-k/top-p (which only choose what may be drawn). vLLM's own log-probs are raw (no T) or renormalised over
    the kept tokens; the engine divides the logits by T in the model, so vLLM's raw ones are literl's."""
    engine, model = session_engine.engine, vllm_tiny_qwen3().eval()
    engine.sync_weights(model)
    prompts = _prompts()
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=24)
    generation = engine.generate(prompts, params, rng=torch.Generator().manual_seed(0))
    assert generation.response_ids_BT.shape == (len(prompts), 24)
    assert max_gap(model, prompts, generation, temperature) < TOLERANCE
    assert (generation.rollout_logp_BT[~generation.mask_BT] == 0).all()


def test_responses_end_at_literls_eos_ids_and_truncation_is_reported(session_engine):
    """The engine stops at EOS_IDS (5, 7), not at the model config's EOS (1): a row is either cut right after its
    first 5/7, or holds max_new_tokens tokens with none of them and is marked truncated; 1 appears mid-response."""
    engine, model = session_engine.engine, vllm_tiny_qwen3().eval()
    engine.sync_weights(model)
    prompts = _prompts(group=16)
    generation = engine.generate(prompts, SamplingParams(max_new_tokens=30), rng=torch.Generator().manual_seed(1))
    ids_BT, mask_BT = generation.response_ids_BT, generation.mask_BT
    is_eos_BT = (ids_BT == EOS_IDS[0]) | (ids_BT == EOS_IDS[1])
    lengths_B = mask_BT.sum(-1)
    for b in range(len(prompts)):
        n = int(lengths_B[b])
        assert mask_BT[b, :n].all() and not mask_BT[b, n:].any()
        assert (ids_BT[b, n:] == PAD_ID).all()
        if generation.truncated_B[b]:
            assert n == 30 and not is_eos_BT[b, :n].any()
        else:
            assert is_eos_BT[b, n - 1] and not is_eos_BT[b, :n - 1].any()
    assert generation.truncated_B.any() and not generation.truncated_B.all()
    assert (ids_BT[mask_BT] == 1).any()


def test_the_same_seed_gives_the_same_tokens(session_engine):
    engine = session_engine.engine
    engine.sync_weights(vllm_tiny_qwen3().eval())
    prompts, params = _prompts(), SamplingParams(max_new_tokens=16)
    first = engine.generate(prompts, params, rng=torch.Generator().manual_seed(123))
    again = engine.generate(prompts, params, rng=torch.Generator().manual_seed(123))
    other = engine.generate(prompts, params, rng=torch.Generator().manual_seed(124))
    assert torch.equal(first.response_ids_BT, again.response_ids_BT)
    assert torch.equal(first.rollout_logp_BT, again.rollout_logp_BT)
    assert not torch.equal(first.response_ids_BT, other.response_ids_BT)
    # The G samples of one prompt differ from each other (each has its own seed).
    rows_of_first_prompt = first.response_ids_BT[0::3]
    assert len({tuple(row.tolist()) for row in rows_of_first_prompt}) == len(rows_of_first_prompt)


def test_greedy_decoding_matches_argmax_and_reports_tempered_logprobs(session_engine):
    """Greedy: each token is the argmax of the trainer's logits; its log-prob is still at the given temperature."""
    engine, model = session_engine.engine, vllm_tiny_qwen3().eval()
    engine.sync_weights(model)
    prompts = _prompts(group=1)
    generation = engine.generate(prompts, SamplingParams(greedy=True, temperature=0.5, max_new_tokens=12))
    assert max_gap(model, prompts, generation, 0.5) < TOLERANCE
    for b, prompt in enumerate(prompts):
        tokens = torch.tensor([prompt])
        with torch.no_grad():
            expected = model.generate(tokens, max_new_tokens=12, do_sample=False, eos_token_id=list(EOS_IDS),
                                      pad_token_id=PAD_ID)[0, len(prompt):]
        n = int(generation.mask_BT[b].sum())
        assert generation.response_ids_BT[b, :n].tolist() == expected[:n].tolist()


def test_parity_holds_after_an_optimizer_step_and_a_sync(session_engine):
    """After a sync the engine samples from the new weights: its log-probs equal the updated model's within 1e-4.
    The long prompt was served before the update, so a prefix cache that survived the sync would hand back KV
    blocks of the old weights (measured: 1.6 nats off), and a tied head left unpacked would score with the old
    embedding. Also: the sync moves each distinct tensor once (the tied head is the embedding)."""
    engine = session_engine.engine
    model = vllm_tiny_qwen3().eval()
    engine.sync_weights(model)
    prompts = [LONG_PROMPT] * 2 + _prompts(group=1)
    params = SamplingParams(max_new_tokens=16)
    engine.generate(prompts, params, rng=torch.Generator().manual_seed(2))

    updated = copy.deepcopy(model).train()
    optimizer = torch.optim.AdamW(updated.parameters(), lr=2e-2)
    logits = updated(torch.tensor([LONG_PROMPT])).logits
    (-torch.log_softmax(logits[0, :-1], -1).gather(-1, torch.tensor(LONG_PROMPT[1:])[:, None]).mean()).backward()
    optimizer.step()
    updated.eval()
    metrics = engine.sync_weights(updated)
    distinct = {p.data_ptr(): p.numel() for p in updated.parameters()}
    assert metrics == {"sync/bytes": 4.0 * sum(distinct.values())}

    generation = engine.generate(prompts, params, rng=torch.Generator().manual_seed(3))
    assert max_gap(updated, prompts, generation, 1.0) < TOLERANCE
    # The update moved the log-probs by far more than the tolerance: parity with the old model fails.
    assert max_gap(model, prompts, generation, 1.0) > 100 * TOLERANCE


def test_a_lora_policy_reaches_the_engine_as_its_merged_model(session_engine, tmp_path):
    """A LoRA policy (literl/model/lora.py) syncs its merged weights W + (alpha/r)·B·A under the base model's names: the
    engine's log-probs equal the adapted policy's within 1e-4, not the base's; the folder the engine starts from
    is the merged model too (loaded here by transformers)."""
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from literl.config.load import load_config
    from literl.model.lora import apply_lora
    from literl.rollout.vllm_engine import VllmEngine

    engine = session_engine.engine
    base = vllm_tiny_qwen3().eval()
    spec = load_config(overrides=["model.lora.rank=4", "model.lora.alpha=8",
                                  "model.lora.target_modules=[q_proj,v_proj,down_proj]"]).model.lora
    policy = apply_lora(copy.deepcopy(base), spec).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.2)
    engine.sync_weights(policy)
    prompts = _prompts(group=2)
    generation = engine.generate(prompts, SamplingParams(max_new_tokens=16), rng=torch.Generator().manual_seed(4))
    assert max_gap(policy, prompts, generation, 1.0) < TOLERANCE
    assert max_gap(base, prompts, generation, 1.0) > 100 * TOLERANCE

    VllmEngine._save_model(engine, policy, str(tmp_path / "model"))
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    assert max_gap(merged, prompts, generation, 1.0) < TOLERANCE


def test_the_trainers_threads_and_rng_are_untouched(session_engine):
    """In-process vLLM replaces torch.set_num_threads with a no-op and reseeds the global RNG; in its own process
    it can do neither to the trainer."""
    assert session_engine.threads_after == session_engine.threads_before
    assert torch.equal(session_engine.rng_after, session_engine.rng_before)
    engine = session_engine.engine
    engine.sync_weights(vllm_tiny_qwen3().eval())
    state = torch.get_rng_state()
    engine.generate(_prompts(group=1), SamplingParams(max_new_tokens=4), rng=torch.Generator().manual_seed(0))
    assert torch.equal(torch.get_rng_state(), state)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    assert torch.get_num_threads() == 1
    torch.set_num_threads(threads)


def test_a_failed_start_names_the_log_and_the_fix(tmp_path):
    """The trainer's own environment has no vLLM: the engine process fails on its first import. The error says
    so, names the log file and how to set the engine's environment up; the engine's folder is removed."""
    import importlib.util
    import sys
    import tempfile

    from literl.rollout.vllm_engine import VllmEngine, VllmEngineError

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("this environment has vLLM, so the engine would start")
    root = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    before = {name for name in os.listdir(root) if name.startswith("literl-vllm-")}
    log = tmp_path / "engine.log"
    with pytest.raises(VllmEngineError) as raised:
        VllmEngine(vllm_tiny_qwen3(), eos_token_ids=EOS_IDS, pad_id=PAD_ID, python=sys.executable,
                   log_path=str(log), start_timeout_s=120)
    message = str(raised.value)
    assert "No module named 'vllm'" in message
    assert str(log) in message and "./run.sh vllm-setup" in message
    assert "No module named 'vllm'" in log.read_text()
    assert {name for name in os.listdir(root) if name.startswith("literl-vllm-")} <= before


def test_the_engine_runs_in_its_own_session_so_the_terminals_ctrl_c_reaches_only_the_trainer(session_engine):
    """Ctrl-C in a terminal signals the foreground process group: the trainer finishes its step, saves and then
    stops the engine itself; the engine, in a session of its own, is never interrupted mid-generation."""
    pid = session_engine.engine.process.proc.pid
    assert os.getsid(pid) == pid != os.getsid(0)


def test_the_engine_process_exits_when_the_trainer_dies(tmp_path):
    """A trainer killed before it could stop its engine: the engine notices its parent is gone and exits (here
    while it still waits for the trainer to connect, before vLLM is even imported)."""
    import subprocess
    import sys
    import time

    parent = (
        "import json, os, subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-m', 'literl.rollout.vllm_server'], stdin=subprocess.PIPE,\n"
        "                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)\n"
        f"spec = {{'address': {str(tmp_path / 'engine.sock')!r}, 'authkey': '00' * 32, 'parent_pid': os.getpid(),\n"
        "        'model': '', 'llm_kwargs': {}}\n"
        "child.stdin.write((json.dumps(spec) + '\\n').encode()); child.stdin.flush()\n"
        "print(child.pid, flush=True)\n"
        "os._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, check=True, timeout=60)
    child = int(out.stdout.strip())
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False
