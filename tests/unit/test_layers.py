"""prq's folders are its layers, and imports point down only.

Every `import` in the package counts: at module level, inside functions, and under
`TYPE_CHECKING` (a type-only import is still a dependency a reader has to follow). The layers,
lowest first, are the ones docs/design.md's map describes; a module may import its own layer and
the layers below it, never one above, and no set of modules may import each other in a ring.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "prq"

#: prq's layers, lowest first: the first part of a module's name under prq picks its layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_version",),
    ("core", "datastreams"),
    ("observe",),
    ("protocol",),
    ("transport",),
    ("node",),
    ("serve",),
    ("facade",),
    ("ops", "bulk", "embedded"),
    ("spark",),
    ("cli", "demo", ""),  # "": prq/__init__.py, the public API
)

#: The longest module the structure allows (lines, docstrings and comments included).
MAX_LINES = 400


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """The prq modules `name` imports, with the line of each import."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "prq":
                    yield _nearest(alias.name, known), node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != "prq":
                continue
            for alias in node.names:
                whole = f"{target}.{alias.name}"
                yield (whole if whole in known else _nearest(target, known)), node.lineno


def _nearest(dotted: str, known: dict[str, Path]) -> str:
    """The module `dotted` names, or the package that holds it."""
    while dotted not in known:
        dotted = dotted.rpartition(".")[0]
    return dotted


def layer_of(name: str) -> int:
    """The rank of the layer module `name` belongs to."""
    first = name.split(".")[1] if "." in name else ""
    for rank, members in enumerate(LAYERS):
        if first in members:
            return rank
    raise AssertionError(f"{name} is in no layer: add its folder to LAYERS and the design's map")


MODULES = modules()
GRAPH = {
    name: sorted({target for target, _ in imports_of(name, path, MODULES)} - {name})
    for name, path in MODULES.items()
}


def test_every_module_belongs_to_a_layer() -> None:
    for name in GRAPH:
        layer_of(name)


def test_imports_point_down_only() -> None:
    upward = []
    for name, path in MODULES.items():
        for target, line in imports_of(name, path, MODULES):
            if layer_of(target) > layer_of(name):
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}")
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def test_no_modules_import_each_other_in_a_ring() -> None:
    ring = cycle_in(GRAPH)
    assert ring is None, "an import cycle (type-only imports included): " + " -> ".join(ring or [])


@pytest.mark.parametrize("name", sorted(GRAPH))
def test_no_module_is_over_the_length_the_structure_allows(name: str) -> None:
    lines = len(MODULES[name].read_text("utf-8").splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines: split it by concept"


def test_the_check_finds_a_cycle_and_an_upward_import() -> None:
    # The checks above pass only if they can fail: a ring and an upward edge are found
    ring = cycle_in({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]})
    assert ring is not None and set(ring) == {"a", "b", "c"}
    assert cycle_in({"a": ["b"], "b": ["c"], "d": ["a"]}) is None
    assert layer_of("prq.core.errors") < layer_of("prq.facade.blocking_queue")
    assert layer_of("prq") == len(LAYERS) - 1


def cycle_in(graph: dict[str, list[str]]) -> list[str] | None:
    """One import cycle of `graph` (its first module repeated at the end), or None."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return list(error.args[1])
    return None
