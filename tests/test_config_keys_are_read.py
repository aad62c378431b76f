"""Every config key is read somewhere in literl/ besides the modules that declare, check and document the keys: a
key that is validated and documented but read by nothing (trainer.recompute_old_logp was one) is a switch that does
nothing, which this test refuses.

A read is an attribute load `.name` on an expression that denotes the key's section, read from the source:

- the expression ends in the section's name (`cfg.trainer.steps`, `self.cfg.rollout.vllm.python`, `lora.rank`);
- or it is a name the same function binds to such an expression (`r = cfg.rollout` ... `r.top_p`), a parameter
  annotated with the section's class (`spec: LoraSpec`), or a loop variable over a list section
  (`for entry in cfg.reward.fns: entry.weight`);
- the top-level keys are read on the whole config (`cfg.seed`, `config.imports`, `load_config(...).imports`, or a
  name bound to one).

A key read only under a name the test cannot see (an unannotated parameter, a `getattr` with a computed name) fails
here: name the parameter after its section, or annotate it.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from literl.config.schema import Config, TrickSpec

PACKAGE = Path(__file__).resolve().parents[1] / "literl"
# The modules that declare (schema), check (rules) and document (reference) every key: their reads do not count.
NOT_READERS = {"config/schema.py", "config/rules.py", "config/reference.py"}
WHOLE_CONFIG_NAMES = {"cfg", "config"}
CONFIG_BUILDERS = ("load_config(", "resolve(")     # calls that return a whole Config


def _sections(root) -> dict[str, tuple[str, list[str]]]:
    """Section key ('' for the top level, 'rollout.vllm', 'reward.fns[]' for a list's items) -> (its class name,
    its field names)."""
    out: dict[str, tuple[str, list[str]]] = {}

    def walk(node, key: str) -> None:
        out[key] = (type(node).__name__, [f.name for f in dataclasses.fields(node)])
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            if dataclasses.is_dataclass(value) and not isinstance(value, TrickSpec):
                walk(value, f"{key}.{f.name}".lstrip("."))
            elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
                walk(value[0], f"{key}.{f.name}[]".lstrip("."))

    walk(root, "")
    return out


def _name(section: str) -> str:
    """The name a section is read under: 'rollout.vllm' -> 'vllm', 'reward.fns[]' -> 'fns[]'."""
    return section.rsplit(".", 1)[-1]


def _denotes(expression: str, section: str) -> bool:
    if section == "":
        return expression.split(".")[-1] in WHOLE_CONFIG_NAMES or expression.startswith(CONFIG_BUILDERS)
    name = _name(section)
    return not name.endswith("[]") and (expression == name or expression.endswith("." + name))


def _aliases(function: ast.AST, sections) -> dict[str, set[str]]:
    """Names the function binds to a section: annotated parameters, assignments, loop variables over a list."""
    aliases: dict[str, set[str]] = {}
    args = getattr(function, "args", None)
    for arg in (args.posonlyargs + args.args + args.kwonlyargs) if args else ():
        words = set(ast.unparse(arg.annotation).replace("|", " ").replace("'", " ").split()) if arg.annotation else ()
        aliases.setdefault(arg.arg, set()).update(s for s, (cls, _) in sections.items() if cls in words)
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else [node.targets[0]]
            values = (node.value.elts if isinstance(node.value, ast.Tuple) and len(node.value.elts) == len(targets)
                      else [node.value] * len(targets))
            for target, value in zip(targets, values):
                if isinstance(target, ast.Name):
                    text = ast.unparse(value)
                    aliases.setdefault(target.id, set()).update(s for s in sections if _denotes(text, s))
        if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
            text = ast.unparse(node.iter)
            aliases.setdefault(node.target.id, set()).update(
                s for s in sections if s.endswith("[]") and (text == _name(s)[:-2]
                                                             or text.endswith("." + _name(s)[:-2])))
    return aliases


def _reads(tree: ast.AST, sections) -> set[tuple[str, str]]:
    """(section, field) for every attribute load in `tree` that reads a key (module level and in each function)."""
    found = set()
    scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:
        aliases = _aliases(scope, sections)
        for node in ast.walk(scope):
            if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)):
                continue
            expression = ast.unparse(node.value)
            for section, (_, fields) in sections.items():
                if node.attr in fields and (_denotes(expression, section) or section in aliases.get(expression, ())):
                    found.add((section, node.attr))
    return found


def _unread(sources: dict[str, str], root) -> list[str]:
    sections = _sections(root)
    found = set()
    for text in sources.values():
        found |= _reads(ast.parse(text), sections)
    return sorted(f"{section}.{name}".lstrip(".") for section, (_, fields) in sections.items() for name in fields
                  if (section, name) not in found)


def test_every_config_key_is_read_outside_the_config_declarations():
    sources = {str(path.relative_to(PACKAGE)): path.read_text() for path in sorted(PACKAGE.rglob("*.py"))
               if str(path.relative_to(PACKAGE)) not in NOT_READERS}
    assert _unread(sources, Config()) == [], "declared but never read: wire each key in, or remove it"


@dataclasses.dataclass
class _Inner:
    used: int = 0
    unused: int = 0


@dataclasses.dataclass
class _Item:
    weight: float = 1.0
    label: str = ""


@dataclasses.dataclass
class _Root:
    seed: int = 0
    inner: _Inner = dataclasses.field(default_factory=_Inner)
    items: list = dataclasses.field(default_factory=lambda: [_Item()])


def test_the_scan_sees_direct_aliased_annotated_and_looped_reads_and_nothing_else():
    """A hand-made tree: inner.used is read through an alias, items[].weight in a loop, seed on the config;
    inner.unused is only assigned, items[].label only read on an unrelated object: both are reported."""
    source = '''
def run(cfg):
    n = cfg.inner
    total = n.used + load_config().seed
    cfg.inner.unused = 3
    for item in cfg.items:
        total += item.weight
    return other.label
'''
    assert _unread({"run.py": source}, _Root()) == ["inner.unused", "items[].label"]
    annotated = "def f(x: _Inner, c):\n    return x.unused + c.inner.used + c.seed + c.items\n"
    assert _unread({"f.py": annotated}, _Root()) == ["inner", "items", "items[].label", "items[].weight", "seed"]
