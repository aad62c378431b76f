"""Import paths from before the package layout, kept working: `import literl.config_loader` gives
`literl.config.load`, the same module object (so a registry is never built twice), with a DeprecationWarning that
names the new path. User modules, plugins and pickles written against the old paths keep loading.

`literl/__init__.py` installs the finder once; it answers only for the names below and for the submodules of the
moved packages, and before the path finder, which would otherwise load a second copy of a moved package's
submodule under its old name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "literl.config_loader": "literl.config.load",
    "literl.config_rules": "literl.config.rules",
    "literl.profiles": "literl.config.profiles",
    "literl.plugins": "literl.config.plugins",
    "literl.config_command": "literl.commands.config_command",
    "literl.batch": "literl.algorithm.batch",
    "literl.ops": "literl.algorithm.ops",
    "literl.registry": "literl.algorithm.registry",
    "literl.objective": "literl.algorithm.objective",
    "literl.metric_reduction": "literl.algorithm.metric_reduction",
    "literl.tricks": "literl.algorithm.tricks",
    "literl.diagnostics": "literl.algorithm.diagnostics",
    "literl.lora": "literl.model.lora",
    "literl.model.prompts": "literl.model.prompt_pass",
    "literl.host_memory": "literl.run.host_memory",
    "literl.provenance": "literl.run.provenance",
    "literl.run_lock": "literl.run.lock",
    "literl.terminal_text": "literl.data.terminal_text",
    "literl.training.run_directory": "literl.run.directory",
    "literl.training.run_record": "literl.run.manifest",
    "literl.training.metrics": "literl.run.metrics_log",
    "literl.training.console": "literl.run.console",
    "literl.training.load_watch": "literl.run.load_watch",
    "literl.training.checkpoint": "literl.run.checkpoint",
    "literl.training.problems": "literl.assembly.training_set",
    "literl.training.model_loading": "literl.assembly.model_loading",
    "literl.training.limits": "literl.assembly.limits",
    "literl.training.api": "literl.assembly.api",
    "literl.evaluation.difficulty": "literl.commands.difficulty_command",
    "literl.training.command": "literl.commands.train_command",
    "literl.arena.command": "literl.commands.ablate_command",
    "literl.arena.report_command": "literl.commands.report_command",
    "literl.evaluation.command": "literl.commands.eval_command",
    "literl.evaluation.metrics": "literl.evaluation.sample_metrics",
    "literl.config_reference": "literl.config.reference",
    "literl.components": "literl.assembly.builder",
    "literl.rollout.generator": "literl.rollout.engine",
    "literl.rollout.hf_engine": "literl.rollout.native_engine",
}


def new_name(old: str) -> str | None:
    """The module's path today, for an old path or a submodule of a moved package; None for any other name."""
    if old in MOVED:
        return MOVED[old]
    head, _, tail = old.rpartition(".")
    while head:
        if head in MOVED:
            return f"{MOVED[head]}.{old[len(head) + 1:]}"
        head, _, _ = head.rpartition(".")
    return None


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if new_name(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        target = new_name(spec.name)
        warnings.warn(f"{spec.name} is now {target}; import it from there", DeprecationWarning, stacklevel=2)
        return importlib.import_module(target)

    def exec_module(self, module) -> None:
        """The module is the new path's, already executed."""


def install() -> None:
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModules())
