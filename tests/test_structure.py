"""The package's shape: no import cycle inside literl/, the runtime layers one-way (model below rollout and
training, rollout and training apart), tricks importing only what a pure tensor function needs, and the layer body
written once. Imports are read from the source (module level and inside functions alike), so a lazy import that
closes a circle is caught too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "literl"
# What a trick module may import besides the standard library (style.md §3.9).
TRICK_IMPORTS = {"literl.algorithm.tricks", "literl.algorithm.ops", "literl.algorithm.registry", "torch"}
MAX_LINES = 500


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


@pytest.mark.parametrize("lower, upper", [("literl.model", "literl.rollout"), ("literl.model", "literl.training"),
                                          ("literl.rollout", "literl.training"), ("literl.training", "literl.rollout")])
def test_layers_import_one_way(lower, upper):
    """The decoder runtime (literl.model) sits below both rollout and training; rollout and training never import
    each other (the trainer wires them through protocols)."""
    wrong = {name: sorted(t for t in targets if t == upper or t.startswith(upper + "."))
             for name, targets in GRAPH.items() if name == lower or name.startswith(lower + ".")}
    assert {name: targets for name, targets in wrong.items() if targets} == {}


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


def test_source_files_stay_short():
    long_files = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long_files == {}


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
