"""`literl train [--preset NAME] [--config FILE] [key=value ...]`."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from literl.config.plugins import add_import_argument, with_imports

DEFAULT_PRESET = "lite_ppo"

EPILOG = """\
examples:
  literl train                                   # the embedded testbed with the lite_ppo preset
  literl train --preset dapo trainer.steps=100
  literl train --preset grpo algorithm.policy_loss.name=cispo algorithm.policy_loss.params.ub=5.0
  literl train --model /models/qwen3-0.6b --data math_train --data-dir ../shared/data    # the real-model profile
  literl train --model /models/qwen3-0.6b --data train.jsonl data.chat_template_kwargs.enable_thinking=false
  literl train --import my_tricks algorithm.advantage.name=my_advantage    # a trick registered in my_tricks.py
  literl train cluster.address=local cluster.trainer_ranks=2 cluster.rollout_workers=2   # on a local Ray
                                                               # cluster (docs/scaling.md; needs literl[ray])
  literl train trainer.output_dir=runs/a trainer.resume=true     # continue an interrupted run from its own
                                                               # config.yaml (overrides given apply on top)

`literl presets` lists presets; `literl config --explain` lists every key and every trick's parameters.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("--preset", default=None,
                        help=f"algorithm preset to start from (default: {DEFAULT_PRESET}; 'none' for the bare "
                             "defaults). With trainer.resume=true the run's saved config.yaml is the base instead, "
                             "and a preset given here is layered over it")
    parser.add_argument("--config", dest="config_file", help="YAML file layered over the preset")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--model", help="a Hugging Face model directory (sets model.path; chooses the real-model "
                                        "profile: model.profile)")
    parser.add_argument("--data", help="training problems: a .jsonl/.parquet file, a benchmark name (e.g. math_train) "
                                       "or a hub dataset id (sets data.train)")
    parser.add_argument("--data-dir", help="folder holding the benchmark files, e.g. ../shared/data (sets data.dir; "
                                           "default $LITERL_DATA_DIR)")
    add_import_argument(parser)
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted config overrides, applied last (e.g. trainer.steps=20 seed=1)")


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """--model / --data / --data-dir as key=value overrides (JSON-quoted: any path is a YAML string). They come
    first, so a key=value given on the same line wins."""
    pairs = (("model.path", args.model), ("data.train", args.data), ("data.dir", args.data_dir))
    return [f"{key}={json.dumps(value, ensure_ascii=False)}" for key, value in pairs if value is not None]


def run(args: argparse.Namespace) -> int:
    from literl.config.load import load_config, resolve, to_yaml
    from literl.config.plugins import import_user_modules, imports_override
    from literl.config.errors import ConfigError

    preset = DEFAULT_PRESET if args.preset is None else None if args.preset == "none" else args.preset
    overrides = [*flag_overrides(args), *args.overrides]
    try:
        import_user_modules(args.imports)
        if args.imports:
            # Recorded in the config (so config.yaml, a resume and `literl config` see them), after any a file names.
            named = load_config(preset=preset, config_file=args.config_file, overrides=overrides)
            overrides.append(imports_override(with_imports(named.imports, args.imports)))
        cfg = load_config(preset=preset, config_file=args.config_file, overrides=overrides)
        base = _resumed_config(cfg, args.config_file)
        if base is not None:
            # Continue the run as it was configured, not as today's defaults would configure it: only what the
            # command names explicitly changes.
            explicit_preset = None if args.preset in (None, "none") else args.preset
            layered_file = None if base.source == args.config_file else args.config_file
            cfg = load_config(preset=explicit_preset, config_file=layered_file, overrides=overrides,
                              base=base.config)
    except (ConfigError, FileNotFoundError) as err:
        print(f"literl train: config error: {err}", file=sys.stderr)
        return 2
    problem = _replay_problem(args, cfg)
    if problem:
        print(f"literl train: {problem}", file=sys.stderr)
        return 2
    if args.print_config:
        from literl.algorithm.objective import Objective

        try:
            Objective.from_config(cfg)      # the check a run makes before its model loads
        except (ConfigError, ValueError) as err:
            print(f"literl train: config error: {err}", file=sys.stderr)
            return 2
        notes: list[str] = []
        print(to_yaml(resolve(cfg, notes=notes)))
        for note in notes:
            print(f"[literl] {note}", file=sys.stderr)
        return 0
    from literl.distributed import ClusterError
    from literl.rewards import RewardsFailing
    from literl.run.step_outcomes import GroupFilterStalled
    from literl.run.lock import DirectoryBusy
    from literl.assembly.api import run as run_training
    from literl.run.checkpoint import CheckpointError
    from literl.training.trainer import NonFiniteTraining, TrainingInterrupted

    try:
        run_training(cfg)
    except TrainingInterrupted:
        return 130                  # the trainer said where the checkpoint is
    except KeyboardInterrupt:
        print("literl train: interrupted before a training step finished, so nothing new was saved. Run the same "
              "command again to start (or, with trainer.resume=true, continue) the run.", file=sys.stderr)
        return 130
    except (FileExistsError, FileNotFoundError, ConfigError, ValueError, DirectoryBusy, CheckpointError,
            ClusterError) as err:
        print(f"literl train: {err}", file=sys.stderr)
        return 2
    except (NonFiniteTraining, RewardsFailing, GroupFilterStalled) as err:   # the trainer said what it saved
        print(f"literl train: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"literl train: {_os_error_message(err)}", file=sys.stderr)
        return 1
    return 0


def _replay_problem(args: argparse.Namespace, cfg) -> str | None:
    """A config.yaml taken from a run directory (by --config, or as the base of a resume) whose run.json says
    that the run was given objects it cannot name (literl/run/manifest.py)."""
    from literl.run.manifest import override_keys, replay_problem

    sources = [Path(args.config_file)] if args.config_file else []
    if cfg.trainer.resume and cfg.trainer.output_dir:
        sources.append(Path(cfg.trainer.output_dir) / "config.yaml")
    for source in sources:
        problem = replay_problem(source, override_keys(args.overrides))
        if problem:
            return problem
    return None


@dataclass
class _SavedConfig:
    config: object
    source: str


def _resumed_config(cfg, config_file: str | None) -> _SavedConfig | None:
    """The config a resume continues from: the run's config.yaml, or the --config FILE the user names instead
    when config.yaml is missing, empty or unreadable (without one, resuming is refused: the defaults would
    silently change the algorithm halfway through the run)."""
    from literl.config.load import from_yaml_file
    from literl.config.errors import ConfigError

    if not (cfg.trainer.resume and cfg.trainer.output_dir):
        return None
    run_dir = Path(cfg.trainer.output_dir)
    saved = run_dir / "config.yaml"
    problem = _unreadable(saved)
    if problem is None:
        return _SavedConfig(from_yaml_file(saved), str(saved))
    if not _holds_a_run(run_dir):
        return None                  # nothing to continue: a fresh start from the command's config
    if config_file:
        return _SavedConfig(from_yaml_file(config_file), config_file)
    from literl.run.checkpoint import latest_checkpoint

    newest = latest_checkpoint(run_dir)
    kept = newest / "config.yaml" if newest is not None and (newest / "config.yaml").is_file() else None
    hint = (f"the newest checkpoint keeps the config it was written with: add --config {kept}" if kept else
            "name the config the run used with --config FILE")
    raise ConfigError(f"cannot resume {run_dir}: its config.yaml {problem}, and without it the run would continue "
                      f"with other settings than it started with. To continue, {hint} (it then takes the place of "
                      "config.yaml; key=value overrides still apply on top)")


def _unreadable(path: Path) -> str | None:
    """Why `path` cannot serve as a run's config, or None when it can."""
    from literl.config.load import from_yaml_file
    from literl.config.errors import ConfigError

    if not path.is_file():
        return "is missing"
    try:
        if not path.read_bytes().strip():
            return "is empty"
        from_yaml_file(path)
    except (OSError, ConfigError) as err:
        return f"cannot be read ({err})"
    return None


def _holds_a_run(run_dir: Path) -> bool:
    return run_dir.is_dir() and any((run_dir / name).exists()
                                    for name in ("checkpoints", "metrics.jsonl", "summary.json", "final"))


def _os_error_message(err: OSError) -> str:
    """A disk that is full or read-only, or a path that cannot be written: what failed and what to do."""
    import errno

    where = f" ({err.filename})" if err.filename else ""
    if err.errno in (errno.ENOSPC, errno.EDQUOT) and "trainer.keep_checkpoints" not in str(err):
        return (f"no space left on the device{where}: free some space, or move trainer.output_dir to a larger "
                "disk; then continue with trainer.resume=true")
    if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (f"cannot write{where}: {err.strerror}. Choose a writable trainer.output_dir (the run directory "
                "and its parent must be writable)")
    return str(err)
