"""Twins of prq's scripts that read the simulation's clock (tests/sim/clock.py) where the
originals call TIME; everything else in them is the original text, unless a run plants a defect
(`Plant`: the simulation's own test that it finds one). The simulation's link sends a twin
wherever a call names an original (as prq.protocol.scripts.loading.for_cluster does for a
cluster's SPUBLISH twins). A plant may also edit a method of the node (`planted_node_class`):
the simulated nodes of that run are then of a subclass carrying the edited method, and prq's
own classes are left as they are."""

from __future__ import annotations

import hashlib
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any, TypeVar

from prq.protocol.effects import Call, Script
from prq.protocol.scripts.loading import ALL_SCRIPTS
from tests.sim.clock import CLOCK_KEY

__all__ = ["Plant", "Twins", "planted_class", "planted_node_class", "twin_call", "twins_of"]

_Node = TypeVar("_Node", bound=type)

_TIME = "redis.call('TIME')"
_VIRTUAL = f"redis.call('HMGET', '{CLOCK_KEY}', 's', 'us')"

#: original sha -> twin
Twins = dict[str, Script]


@dataclass(frozen=True)
class Plant:
    """A defect planted in the scripts' twins: each (original, planted) text is replaced in
    every script holding it (an included helper is in several), and each must be found in one,
    so that a change to the scripts cannot leave a plant that plants nothing."""

    name: str
    edits: tuple[tuple[str, str], ...] = ()
    #: (a method of the node, by name, or of another class the simulation uses, as
    #: "SendState.claim"; original text, planted text) edits of that code: the method's
    #: source, as its file has it, is edited and compiled again in its module
    code: tuple[tuple[str, str, str], ...] = ()


def _script(script: Script, source: str) -> Script:
    return Script(
        script.name, source, hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
    )


def twins_of(plant: Plant | None = None) -> Twins:
    """The twins of every script, with `plant`'s defect in them when given."""
    twins: Twins = {}
    found: set[str] = set()
    for script in ALL_SCRIPTS:
        source = script.source.replace(_TIME, _VIRTUAL)
        for original, planted in plant.edits if plant is not None else ():
            if original in source:
                found.add(original)
                source = source.replace(original, planted)
        twins[script.sha] = _script(script, source)
    missing = [original for original, _ in (plant.edits if plant else ()) if original not in found]
    if missing:
        raise AssertionError(f"plant {plant.name if plant else ''!r}: no script holds {missing}")
    return twins


def twin_call(call: Call, twins: Twins) -> Call:
    """`call` as the simulation sends it: a script call names the script's twin."""
    twin = twins.get(call.script.sha) if call.script is not None else None
    if twin is None:
        return call
    if call.args[0] == "EVALSHA":
        return Call(("EVALSHA", twin.sha, *call.args[2:]), twin)
    return Call(("SCRIPT", "LOAD", twin.source), twin)


def planted_node_class(node_class: _Node, plant: Plant | None) -> _Node:
    """`node_class`, or a subclass of it whose methods carry `plant`'s code edits of the
    node (those naming a bare method)."""
    return planted_class(node_class, plant, bare=True)


def planted_class(cls: _Node, plant: Plant | None, *, bare: bool = False) -> _Node:
    """`cls`, or a subclass of it whose methods carry `plant`'s code edits that name it
    ("SendState.claim"; with `bare`, also those naming a method alone)."""
    edits = [
        (method.partition(".")[2] or method, original, planted)
        for method, original, planted in (plant.code if plant is not None else ())
        if (method.partition(".")[0] == cls.__name__ if "." in method else bare)
    ]
    if plant is None or not edits:
        return cls
    sources: dict[str, str] = {}
    for method, original, planted in edits:
        source = sources.get(method) or inspect.getsource(getattr(cls, method))
        if original not in source:
            raise AssertionError(f"plant {plant.name!r}: {method} holds no {original!r}")
        sources[method] = source.replace(original, planted)
    methods: dict[str, Any] = {}
    for method, source in sources.items():
        function = getattr(cls, method)
        namespace: dict[str, Any] = {}
        exec(  # noqa: S102 (the test's own edit of prq's source, compiled as prq's)
            compile(textwrap.dedent(source), inspect.getfile(function), "exec"),
            function.__globals__,
            namespace,
        )
        methods[method] = namespace[function.__name__]
    return type(f"Planted{cls.__name__}", (cls,), methods)  # type: ignore[return-value]
