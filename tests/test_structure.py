"""The package's shape: no import cycle inside literl/, each package importing only the packages below it
(`PACKAGE_IMPORTS`: model below rollout and training, rollout and training apart, the algorithm core knowing no
engine or file), tricks importing only what a pure tensor function needs, no function longer than a screen, and the
layer body written once. Imports are read from the source (module level and inside functions alike), so a lazy
import that closes a circle or crosses a layer is caught too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "literl"
# What a trick module may import besides the standard library (style.md §3.9).
TRICK_IMPORTS = {"literl.algorithm.tricks", "literl.algorithm.ops", "literl.algorithm.registry", "torch"}
MAX_FUNCTION_LINES = 80
# The packages each package may import (besides its own and the FOUNDATION modules, the exception types every layer
# raises or catches): literl's architecture as rules, a strict order with no circle.
PACKAGE_IMPORTS = {
    "algorithm": set(),                     # the core: tensors in, tensors out
    "model": {"algorithm"},                 # the shared tensor ops (algorithm.ops)
    "rollout": {"model", "algorithm"},
    "testbed": {"model", "rollout", "algorithm"},
    "data": {"testbed"},                    # the testbed's problems are a registered benchmark
    "config": {"algorithm", "data"},        # the rules check tricks against their registries; prompt defaults
    "rewards": {"data", "config"},
    "run": {"config", "data", "model", "rewards", "algorithm"},
    "training": {"model", "algorithm", "config", "run", "data"},
    "tools": {"rewards", "data", "config"},  # the python sandbox reuses the reward checker's isolation
    # Multi-turn episodes over an engine: tools, chat formats, environments, and their collector (a rollout Collector).
    "multiturn": {"tools", "rollout", "model", "algorithm", "testbed", "data", "rewards", "config"},
    "evaluation": {"data", "rewards", "rollout", "model", "config", "run", "algorithm"},
    # The arena runs trainings as subprocesses: a run is its command line, so it never imports the runtime.
    "arena": {"algorithm", "config", "data", "run"},
    # Ray behind the Engine and Learner protocols, and the arena's runs dispatched as Ray tasks.
    "distributed": {"training", "rollout", "model", "algorithm", "config", "run", "data", "arena"},
    "assembly": {"training", "rollout", "model", "algorithm", "config", "run", "data", "rewards", "evaluation",
                 "distributed", "testbed", "tools", "multiturn"},
    "commands": {"assembly", "training", "rollout", "model", "algorithm", "config", "run", "data", "rewards",
                 "evaluation", "distributed", "testbed", "arena", "tools", "multiturn"},
}
FOUNDATION = {"literl.config.errors", "literl.run.step_outcomes"}
# Imports that cross the order on purpose, each inside the one function that needs it, with the reason.
CROSSINGS = {
    ("literl.algorithm.objective", "literl.config.load"): "Objective.from_config resolves a config not yet "
                                                          "resolved (the profile's response length)",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imported(path: Path) -> set[str]:
    """Every module name the file imports (absolute names; `from pkg import sub` names the submodule)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                names.add(submodule if submodule in MODULES else node.module)
    return names


def _literl_imports(path: Path) -> set[str]:
    """literl modules the file imports, each resolved to the deepest module that exists."""
    out = set()
    for name in _imported(path):
        parts = name.split(".")
        while parts and ".".join(parts) not in MODULES:
            parts.pop()
        if parts and parts[0] == "literl":
            out.add(".".join(parts))
    return out


GRAPH = {name: _literl_imports(path) - {name} for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each an import circle."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _is_package_init(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def test_no_import_cycle_inside_literl():
    """A package's __init__ re-exporting its own submodules is not a circle; any other strongly connected set of
    modules is."""
    graph = {name: {t for t in targets if not (_is_package_init(name) and t.startswith(name + "."))}
             for name, targets in GRAPH.items()}
    assert _cycles(graph) == []


def test_the_detector_sees_a_cycle():
    """A hand-made circle a → b → c → a (and a lone self-import, which is no circle)."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": set(), "b": {"a"}}) == []


def _package(module: str) -> str | None:
    """literl.rollout.collector → rollout; a top-level module (literl, literl.cli) → None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and MODULES[module].name == "__init__.py") else None


def test_every_package_has_its_import_rule():
    packages = {_package(name) for name in MODULES} - {None}
    assert packages == set(PACKAGE_IMPORTS)


def test_packages_import_only_the_layers_below_them():
    """model sits below rollout and training; rollout and training never import each other (the assembly wires
    them through protocols); nothing but the command line imports a command; the algorithm core imports no
    engine, process or file code."""
    wrong = {}
    for name, targets in GRAPH.items():
        package = _package(name)
        if package is None:
            continue
        crossing = sorted(t for t in targets if _package(t) not in (None, package, *PACKAGE_IMPORTS[package])
                          and t not in FOUNDATION and (name, t) not in CROSSINGS)
        if crossing:
            wrong[name] = crossing
    assert wrong == {}


def test_the_foundation_modules_import_nothing_of_literl():
    assert {name: sorted(GRAPH[name]) for name in FOUNDATION if GRAPH[name]} == {}


def test_the_layer_rules_have_no_circle():
    assert _cycles({package: set(allowed) for package, allowed in PACKAGE_IMPORTS.items()}) == []


def test_tricks_import_only_torch_ops_and_the_registry():
    offenders = {}
    for name, path in MODULES.items():
        if not name.startswith("literl.algorithm.tricks"):
            continue
        bad = sorted(imported for imported in _imported(path)
                     if imported.split(".")[0] in ("literl", "torch", "numpy", "transformers")
                     and not any(imported == allowed or imported.startswith(allowed + ".")
                                 for allowed in TRICK_IMPORTS)
                     or imported.split(".")[0] not in _stdlib() | {"literl", "torch"})
        if bad:
            offenders[name] = bad
    assert offenders == {}


def _stdlib() -> set[str]:
    import sys

    return set(sys.stdlib_module_names) | {"__future__"}


def test_only_literl_distributed_imports_ray():
    """Ray is an optional part: a single-process run never imports it, so only the cluster package may."""
    offenders = sorted(name for name, path in MODULES.items()
                       if any(imported == "ray" or imported.startswith("ray.") for imported in _imported(path))
                       and not (name == "literl.distributed" or name.startswith("literl.distributed.")))
    assert offenders == []
    assert any(imported == "ray" for imported in _imported(MODULES["literl.distributed.cluster"]))


def test_the_layer_body_is_written_once():
    """Exactly one file refers to a layer's post-attention norm: every pass runs the one body."""
    files = [str(path.relative_to(PACKAGE.parent)) for path in MODULES.values()
             if "post_attention_layernorm" in path.read_text()]
    assert files == ["literl/model/layer.py"]


def test_no_function_is_longer_than_a_screen():
    """A function over 80 lines does several things; each gets a name of its own."""
    long_functions = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions[f"{name}.{node.name}"] = length
    assert long_functions == {}


OPERATOR_REGISTRATIONS = {"custom_op", "Library", "define", "triton_op"}


def test_no_test_file_registers_a_torch_operator():
    """A torch operator must be registered once per process, and a test file may run twice in one: pytest imports
    it under its base name and a test module importing it as `tests.<dir>.test_x` runs it again, when torch's
    `custom_op` destroys the first registration that the first copy still calls (a use of freed memory: the full
    suite's intermittent crash in the varlen stand-in, 2026-11-27). Operators live in helper modules, imported under
    one name (tests/model/varlen_stand_in.py)."""
    offenders = []
    for path in sorted((PACKAGE.parent / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            func = node.func if isinstance(node, ast.Call) else None
            if (isinstance(func, ast.Attribute) and func.attr in OPERATOR_REGISTRATIONS
                    and isinstance(func.value, ast.Attribute) and func.value.attr == "library"):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


def test_test_files_have_unique_names():
    """pytest imports test files by their base name (no packages under tests/): two files of one name in two folders
    make the second fail to collect."""
    names = [path.name for path in (PACKAGE.parent / "tests").rglob("test_*.py")]
    assert sorted({name for name in names if names.count(name) > 1}) == []
