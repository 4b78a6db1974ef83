"""A tool parameter's bound is declared once and checked once (issue 38).

Declared once: in the tool function's signature (``Field(max_length=..., ge=..., le=...)``, or a
``TaskBound`` for the task limits the environment sets), and every bound ``tools/list`` shows
is exactly one declared there (``tools.server.schema`` adds none of its own; it drops one only
where the server instructions state it once). Checked once: by the argument boundary
(``tools.server.arguments``) before the body runs; no tool body compares a parameter with its
own declared bound again. The body scan is syntactic: it finds ``len(p) > N``, ``p < L``,
``L <= p <= U``, ``p in (0, 1)``, ``type(p) is int`` and a call handed ``p`` with its upper
bound (``check_text("p", p, N)``), against a bound ``p`` declares; a check on bytes
(``len(p.encode())``), on a shape or on runtime state is not one of them, and neither is a
helper that finds the bound by itself (it would escape the scan)."""

from __future__ import annotations

import ast
import asyncio
import inspect
import types
from collections.abc import Iterator
from typing import Annotated, Any, Union, get_args, get_origin

import annotated_types as at
import pytest
from pydantic.fields import FieldInfo

from macula.agent.task_messages import TaskLimits
from tools.groups import content, dht, memory, presence, pubsub, realms, rings, rooms, rpc, tasks
from tools.groups.text_limits import TaskBound, task_limits
from tools.server.arguments import takes_text
from tools.server.schema import LIMIT_SAID_ONCE
from tools.server.server import build_server

GROUPS = (rooms, tasks, memory, content, rpc, pubsub, presence, rings, realms, dht)
ENV = {"MACULA_HOME": "/nonexistent", "MACULA_MCP_TASKS_MAX_TITLE_CHARS": "50"}
SCHEMA_KEY = {
    at.MaxLen: ("maxLength", "max_length"),
    at.MinLen: ("minLength", "min_length"),
    at.Ge: ("minimum", "ge"),
    at.Le: ("maximum", "le"),
    at.Gt: ("exclusiveMinimum", "gt"),
    at.Lt: ("exclusiveMaximum", "lt"),
}
LISTED_KEYS = {key for key, _ in SCHEMA_KEY.values()}


def declared(annotation: Any, limits: TaskLimits) -> set[tuple[str, Any]]:
    """Every bound in ``annotation`` (its ``Annotated`` metadata, union arms included), as
    ``(JSON Schema keyword, value)``."""
    if isinstance(annotation, FieldInfo):
        return {b for item in annotation.metadata for b in declared(item, limits)}
    if isinstance(annotation, TaskBound):
        return {("maxLength", annotation.of(limits))}
    for kind, (key, attribute) in SCHEMA_KEY.items():
        if isinstance(annotation, kind):
            return {(key, getattr(annotation, attribute))}
    origin = get_origin(annotation)
    if origin is Annotated or origin is Union or origin is types.UnionType:
        return {b for arg in get_args(annotation) for b in declared(arg, limits)}
    return set()


def listed(spec: dict[str, Any]) -> set[tuple[str, Any]]:
    arms = [spec, *spec.get("anyOf", [])]
    return {(key, arm[key]) for arm in arms for key in LISTED_KEYS if key in arm}


def tools() -> dict[str, Any]:
    app = build_server(ENV)
    return {tool.name: tool for tool in app._tool_manager.list_tools()}


def test_every_listed_bound_is_the_one_declared_in_the_signature() -> None:
    app = build_server(ENV)
    schemas = {t.name: t.input_schema for t in asyncio.run(app.list_tools())}
    limits = task_limits(ENV)
    assert limits.max_title_chars == 50  # the environment's, not the default
    compared = 0
    for name, tool in tools().items():
        for param, info in tool.fn_metadata.arg_model.model_fields.items():
            bounds = declared(info, limits) | declared(info.annotation, limits)
            said_once = ("maxLength", LIMIT_SAID_ONCE.get(param))
            if said_once in bounds:  # stated once, in the server instructions
                bounds.discard(said_once)
            assert listed(schemas[name]["properties"][param]) == bounds, (name, param)
            compared += len(bounds)
    assert compared >= 120, compared


def test_every_text_parameter_declares_its_length() -> None:
    """Every parameter that takes text declares a length (in its signature, or a task limit);
    a list's items are bounded by what the body and the library do with them."""
    unbounded = []
    for name, tool in tools().items():
        for param, info in tool.fn_metadata.arg_model.model_fields.items():
            bounds = declared(info, TaskLimits()) | declared(info.annotation, TaskLimits())
            if takes_text(info.annotation) and not any(key == "maxLength" for key, _ in bounds):
                unbounded.append((name, param))
    assert unbounded == [("mesh_call", "args"), ("mesh_publish", "fact")]  # any JSON value


# -- no body checks a declared bound again -------------------------------------------------

FLIP = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE}
# (bound, comparison of the parameter with the bound's value) that decides the bound
RESTATES = {
    "max_length": (ast.Gt, ast.LtE),
    "le": (ast.Gt, ast.LtE),
    "lt": (ast.GtE, ast.Lt),
    "ge": (ast.Lt, ast.GtE),
    "gt": (ast.LtE, ast.Gt),
}


def bound_values(info: FieldInfo) -> dict[str, set[Any]]:
    out: dict[str, set[Any]] = {}
    for key, value in declared(info, TaskLimits()) | declared(info.annotation, TaskLimits()):
        attribute = {k: a for k, a in SCHEMA_KEY.values()}[key]
        out.setdefault(attribute, set()).add(value)
    return out


def subject(node: ast.expr, params: set[str]) -> tuple[str, bool] | None:
    """``(parameter, is_len)`` for ``p`` or ``len(p)``, else None."""
    if isinstance(node, ast.Name) and node.id in params:
        return node.id, False
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "len"
        and len(node.args) == 1
    ):
        inner = node.args[0]
        if isinstance(inner, ast.Name) and inner.id in params:
            return inner.id, True
    return None


def value_of(node: ast.expr, module: types.ModuleType) -> Any:
    try:
        return eval(compile(ast.Expression(node), "<bound>", "eval"), vars(module))
    except Exception:
        return None


def restates(
    node: ast.Compare, bounds: dict[str, dict[str, set[Any]]], module: types.ModuleType
) -> bool:
    """Whether comparison ``node`` decides a bound one of the parameters declares."""
    sides = [node.left, *node.comparators]
    for left, op, right in zip(sides, node.ops, sides[1:], strict=False):
        for this, kind, other in ((left, type(op), right), (right, FLIP.get(type(op)), left)):
            found = subject(this, set(bounds))
            if found is None:
                continue
            param, is_len = found
            declared_here = bounds[param]
            if kind in (ast.In, ast.NotIn) and isinstance(other, ast.Tuple):
                values = value_of(other, module)
                span = (min(values), max(values)) if values else None
                if span in {
                    (lo, hi)
                    for lo in declared_here.get("ge", ())
                    for hi in declared_here.get("le", ())
                }:
                    return True
                continue
            value = value_of(other, module)
            for bound, values in declared_here.items():
                same = is_len == (bound == "max_length") and value in values
                if same and kind in RESTATES[bound]:
                    return True
    return False


def restated(
    function: ast.AsyncFunctionDef, bounds: dict[str, dict[str, set[Any]]], module: Any
) -> Iterator[str]:
    """Each comparison (or ``type(p)`` test) in ``function`` that re-checks a declared bound."""
    bounded = {param: found for param, found in bounds.items() if found}
    for node in ast.walk(function):
        called = isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        if called and node.func.id == "type" and subject(node.args[0], set(bounded)):
            yield f"line {node.lineno}: {ast.unparse(node)}"
        if isinstance(node, ast.Compare) and restates(node, bounded, module):
            yield f"line {node.lineno}: {ast.unparse(node)}"
        if isinstance(node, ast.Call) and hands_on_bound(node, bounded, module):
            yield f"line {node.lineno}: {ast.unparse(node)}"


def hands_on_bound(
    node: ast.Call, bounds: dict[str, dict[str, set[Any]]], module: types.ModuleType
) -> bool:
    """Whether ``node`` passes a parameter together with a value it is bounded by (a helper
    that checks it again: ``check_text("purpose", purpose, MAX_PURPOSE_CHARS)``)."""
    given = [*node.args, *(keyword.value for keyword in node.keywords)]
    params = [found[0] for arg in given if (found := subject(arg, set(bounds)))]
    values = [value_of(arg, module) for arg in given if isinstance(arg, ast.Name | ast.Attribute)]
    return any(
        value in limits and value is not None
        for param in params
        for bound, limits in bounds[param].items()
        if bound in ("max_length", "le", "lt")
        for value in values
    )


def body_restatements(module: types.ModuleType, source: str) -> list[str]:
    found = []
    registered = tools()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.AsyncFunctionDef) or node.name not in registered:
            continue
        fields = registered[node.name].fn_metadata.arg_model.model_fields
        bounds = {param: bound_values(info) for param, info in fields.items()}
        found += [f"{node.name} {where}" for where in restated(node, bounds, module)]
    return found


@pytest.mark.parametrize("group", GROUPS, ids=lambda group: group.__name__)
def test_no_tool_body_checks_a_declared_bound_again(group: types.ModuleType) -> None:
    assert body_restatements(group, inspect.getsource(group)) == []


def test_the_body_scan_finds_restated_bounds() -> None:
    """The scan is not vacuous: the checks these bodies held before issue 38 are found."""
    before = """
async def mesh_watch(ctx, topic, duration_seconds=30.0, count=10, realm=None):
    if not topic or len(topic) > MAX_TOPIC:
        return 1
    if not 0 < duration_seconds <= MAX_WAIT_S:
        return 2
    if count < 1:
        return 3
async def mesh_open_room(ctx, purpose=None, public=0, private=0, wait_join_seconds=30.0):
    if public not in (0, 1) or type(private) is not int:
        return 4
    if wait_join_seconds > 0 and not purpose:  # ge=0: a wait asked for, not a bound
        return 5
"""
    found = body_restatements(pubsub, before)  # MAX_TOPIC, MAX_WAIT_S: pubsub's
    assert sorted(f.split(":")[0] for f in found) == [
        "mesh_open_room line 10",
        "mesh_open_room line 10",
        "mesh_watch line 3",
        "mesh_watch line 5",
        "mesh_watch line 7",
    ], found
