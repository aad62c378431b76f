"""A resumed run continues its wandb run (the id is kept in the run directory), checked with a real wandb in
offline mode. wandb is the `literl[wandb]` extra (also in `dev`); without it this test is skipped."""

from __future__ import annotations

import string

import pytest

from literl.cli import main
from literl.run.metrics_log import WANDB_ID_FILE, wandb_run_id
from tests.training.test_trainer import TINY


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install 'literl[wandb]' to run this test)")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)


def offline_run_ids(run_dir):
    """wandb names each offline session's folder offline-run-<date>_<time>-<run id>."""
    return {p.name.rsplit("-", 1)[-1] for p in (run_dir / "wandb").glob("offline-run-*")}


def test_resuming_continues_the_same_wandb_run(tiny_qwen3_dir, tmp_path, offline_wandb):
    out = tmp_path / "run"
    base = [f"model.path={tiny_qwen3_dir}", f"trainer.output_dir={out}", *TINY, "trainer.save_every=1",
            "trainer.trackers=[wandb]", "eval.before=false"]
    assert main(["train", *base, "trainer.steps=1"]) == 0
    run_id = (out / WANDB_ID_FILE).read_text().strip()
    assert len(run_id) == 8 and offline_run_ids(out) == {run_id}
    sessions = set((out / "wandb").glob("offline-run-*"))
    assert main(["train", f"trainer.output_dir={out}", "trainer.resume=true", "trainer.steps=2"]) == 0
    assert (out / WANDB_ID_FILE).read_text().strip() == run_id
    assert offline_run_ids(out) == {run_id}, "the resumed session opened a wandb run of its own"
    assert set((out / "wandb").glob("offline-run-*")) >= sessions


def test_the_id_is_created_once_and_a_given_one_is_kept(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    first = wandb_run_id(tmp_path / "a")
    assert wandb_run_id(tmp_path / "a") == first
    assert len(first) == 8 and all(c in string.ascii_lowercase + string.digits for c in first)
    monkeypatch.setenv("WANDB_RUN_ID", "given123")
    assert wandb_run_id(tmp_path / "b") == "given123" and wandb_run_id(tmp_path / "a") == first
