"""Two `literl ablate` on one --out used to both run, each relaunching and clearing the other's runs (issue 22)."""

from __future__ import annotations

import signal
import sys

from literl.cli import main
from tests.training.test_misuse import _hold_lock


def test_a_second_ablation_on_one_folder_is_refused_with_the_holders_pid(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    out = tmp_path / "ablation"
    holder = _hold_lock(out)
    try:
        assert main(["ablate", "advantage_norm", "trainer.steps=1", "--out", str(out)]) == 2
        assert f"ablation folder {out} is in use by another literl process (pid {holder.pid})" in \
            capsys.readouterr().err
        assert not (out / "plan.json").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
