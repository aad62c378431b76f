"""A stand-in for `python -m literl.cli train` that the runner tests launch instead of the real trainer.

It reads the overrides the runner passes (trainer.output_dir, trainer.steps, seed, trainer.resume), writes a
run directory step by step (FAKE_STEP_SECONDS apart), saves `checkpoints/latest` on SIGTERM and exits 130
like the trainer (and every FAKE_CHECKPOINT_EVERY steps), and exits 3 without a summary when an override `fake.fail=true` is given. It records the
CUDA_VISIBLE_DEVICES it saw (devices.jsonl), and FAKE_EFFECT=variant:delta gives a variant a known effect.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
run_dir = Path(args["trainer.output_dir"])
steps = int(args.get("trainer.steps", 3))
pause = float(os.environ.get("FAKE_STEP_SECONDS", "0.05"))
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
run_dir.mkdir(parents=True, exist_ok=True)
with open(run_dir / "launches.txt", "a") as f:   # lets a test count how often a run was (re)started
    f.write(" ".join(sys.argv[1:]) + "\n")
launched = time.time()
start = 0
latest = run_dir / "checkpoints" / "latest"
if latest.is_file() and args.get("trainer.resume") == "true":
    start = int(latest.read_text().split("_")[1])
    if (run_dir / "metrics.jsonl").is_file():    # as the trainer does: steps after the checkpoint are redone
        kept = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                if json.loads(line)["step"] <= start]
        (run_dir / "metrics.jsonl").write_text("".join(line + "\n" for line in kept))
print(f"fake trainer: {run_dir} from step {start}", flush=True)
if args.get("fake.fail") == "true":
    print("fake trainer: failing on purpose", flush=True)
    sys.exit(3)
if start == 0:
    (run_dir / "eval.jsonl").write_text(json.dumps({"step": 0, "tag": "before", "testbed/accuracy": 0.5}) + "\n")
step = start


def checkpoint():
    (run_dir / "checkpoints" / f"step_{step:06d}").mkdir(parents=True, exist_ok=True)
    latest.write_text(f"step_{step:06d}")


every = int(os.environ.get("FAKE_CHECKPOINT_EVERY", "0"))    # 0: only on SIGTERM and at the end
while step < steps and not stop:
    time.sleep(pause)
    step += 1
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "accuracy": 0.5}) + "\n")
    if every and step % every == 0:
        checkpoint()


checkpoint()
with open(run_dir / "devices.jsonl", "a") as f:   # which devices it saw, and when: a test checks they were disjoint
    f.write(json.dumps({"devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": launched, "end": time.time()})
            + "\n")
if step < steps:
    sys.exit(130)
seed = int(args.get("seed", 0))
final = 0.5 + 0.01 * seed
if "FAKE_EFFECT" in os.environ:
    # FAKE_EFFECT=variant:delta adds delta to that variant's final accuracy, plus a noise of sd 0.01 fixed by
    # (variant, seed), so the sequential tests have a known effect and a spread (the variant is the folder's).
    import random

    effect_variant, _, delta = os.environ["FAKE_EFFECT"].partition(":")
    variant = run_dir.parent.parent.name
    final += (float(delta) if variant == effect_variant else 0.0) + random.Random(f"{variant}-{seed}").gauss(0, 0.01)
with open(run_dir / "eval.jsonl", "a") as f:
    f.write(json.dumps({"step": steps, "tag": "after", "testbed/accuracy": final}) + "\n")
(run_dir / "summary.json").write_text(json.dumps({"steps": steps, "seed": seed}))
