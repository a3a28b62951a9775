"""The handler `prq worker` serves: imported by MODULE:FUNCTION (a usage error if it does not
import, is not callable or cannot take the request), and told coroutine from plain (which picks
the facade that serves it).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable

import typer

from prq.cli.options import error_line
from prq.protocol.effects import Handler

__all__ = ["is_coroutine_handler", "load_handler"]


def load_handler(spec: str) -> Handler:
    """Import `module:attribute[.attribute...]` and return it; typer.BadParameter if it does
    not import, is missing, is not callable, or cannot take one argument (the request)."""
    hint = "MODULE:FUNCTION"
    module_name, sep, attributes = spec.partition(":")
    if not sep or not module_name.strip() or not attributes.strip():
        raise typer.BadParameter(
            f"{spec!r} is not MODULE:FUNCTION, e.g. myapp.handlers:lookup", param_hint=hint
        )
    # Like `python -m` and uvicorn: modules in the current directory can be named (and stay
    # importable while the worker runs: the handler's module may import more lazily).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: object = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise typer.BadParameter(
                f"no module named {exc.name!r} (looked in the current directory and sys.path)",
                param_hint=hint,
            ) from exc
        raise typer.BadParameter(
            f"importing {module_name!r} failed: {error_line(exc)}", param_hint=hint
        ) from exc
    except Exception as exc:
        raise typer.BadParameter(
            f"importing {module_name!r} failed: {error_line(exc)}", param_hint=hint
        ) from exc
    for name in attributes.split("."):
        try:
            target = getattr(target, name)
        except AttributeError as exc:
            raise typer.BadParameter(f"{spec!r}: no attribute {name!r}", param_hint=hint) from exc
    if not callable(target):
        raise typer.BadParameter(
            f"{spec!r} is a {type(target).__name__}, not a function", param_hint=hint
        )
    _check_takes_one_argument(spec, target)
    return target


def _check_takes_one_argument(spec: str, function: Callable[..., object]) -> None:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # some builtins have no signature: let the first call tell
    try:
        signature.bind(object())
    except TypeError as exc:
        raise typer.BadParameter(
            f"{spec!r} must take one argument, the request ({exc})", param_hint="MODULE:FUNCTION"
        ) from exc


def is_coroutine_handler(handler: Handler) -> bool:
    """True for a coroutine function, or an object whose `__call__` is one."""
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(type(handler), "__call__", None)  # noqa: B004  (the class's, not the object's)
    return not inspect.isfunction(handler) and inspect.iscoroutinefunction(call)
