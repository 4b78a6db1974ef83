"""The one boundary every tool call's arguments cross before a tool body runs (``MeshServer``).

The SDK validates arguments with a pydantic model of the tool function (``Tool.fn_metadata``),
but first "pre-parses" any string that looks like JSON for a parameter not typed plain ``str``:
``str | None`` then refuses ``"{\\"sum\\": 6}"`` as not a string, and every schema-level failure
reaches the model as the SDK's pydantic text, not as a tool error it can act on.

Invariants:
- a parameter that takes text (``str``, ``str | None``, a union with ``str``, ``Any``) gets the
  string exactly as sent, JSON-looking or not; only a parameter that cannot take text (a list,
  an object) has a JSON string parsed for it, as the SDK does (models often send ``"[...]"``);
- every argument is checked before the body runs, against the bounds its parameter declares
  (``Field(max_length=..., ge=..., le=...)`` in the signature, ``TaskBound`` for the task
  limits: ``tools.groups.text_limits``), here and nowhere else: unknown parameters, missing ones,
  wrong
  types, values out of range and text longer than its listed ``maxLength`` (said as
  ``"<parameter>: at most N characters (M given)"``, a union's other arms not listed) are all
  listed, each ``"<parameter>: <problem>"``,
  in one ``invalid_argument`` error ``{code, detail, retryable 0, next_action}``
  (``tools.server.results``) that also lists them in ``problems``, as the agent tools' own checks
  do;
  the values themselves are never echoed (they are the caller's data);
- the same validation runs again inside the SDK's ``Tool.run``, on the same model and the same
  data, so what the body receives is what was checked here.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Union, get_args, get_origin

from mcp.server.mcpserver.tools.base import Tool
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata
from mcp_types import CallToolResult
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from macula.agent.task_messages import TaskLimits
from tools.groups.text_limits import TaskBound
from tools.server.results import fail

MAX_LISTED = 20  # problems named in one error; the rest are counted
# the largest integer SQLite stores: the bound of offsets and sequence numbers
MAX_INDEX = 2**63 - 1


def takes_text(annotation: Any) -> bool:
    """Whether a parameter annotated ``annotation`` accepts a string as it is."""
    if annotation is str or annotation is Any:
        return True
    origin = get_origin(annotation)
    if origin is Annotated:
        return takes_text(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return any(takes_text(arm) for arm in get_args(annotation))
    return False


class LiteralArguments(FuncMetadata):
    """``FuncMetadata`` whose pre-parse leaves text alone where the parameter takes text."""

    def pre_parse_json(self, data: dict[str, Any]) -> dict[str, Any]:
        parsed = super().pre_parse_json(data)
        fields = _fields(self)
        return {
            key: value if key not in fields or not takes_text(fields[key].annotation) else data[key]
            for key, value in parsed.items()
        }


def _fields(metadata: FuncMetadata) -> dict[str, FieldInfo]:
    """Every name a caller may use for a parameter (its alias, else its name) -> its field."""
    return {info.alias or name: info for name, info in metadata.arg_model.model_fields.items()}


def adopt(tool: Tool) -> LiteralArguments:
    """``tool`` validating with ``LiteralArguments`` from now on (done once per tool)."""
    current = tool.fn_metadata
    if isinstance(current, LiteralArguments):
        return current
    literal = LiteralArguments(
        arg_model=current.arg_model,
        output_schema=current.output_schema,
        output_model=current.output_model,
        wrap_output=current.wrap_output,
    )
    tool.fn_metadata = literal
    return literal


def _shown(name: str) -> str:
    """A caller's parameter name as an error repeats it: one line, at most 64 characters."""
    flat = name.replace("\n", " ").replace("\r", " ")
    return flat if len(flat) <= 64 else flat[:64] + "…"


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        name = _shown(str(part))
        out += f"[{part}]" if isinstance(part, int) else (f".{name}" if out else name)
    return out or "arguments"


def _problem(error: Any) -> str:
    kind, message = str(error["type"]), str(error["msg"])
    if kind == "missing":
        return "required (missing)"
    if kind == "string_too_long":
        return _too_long(int(error["ctx"]["max_length"]), str(error["input"]))
    given = type(error.get("input")).__name__
    given = {"str": "text", "dict": "an object", "list": "an array", "NoneType": "null"}.get(
        given, given
    )
    text = message[0].lower() + message[1:] if message else kind
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return f"{text} (got {given})"
    return text


def _too_long(limit: int, text: str) -> str:
    return f"at most {limit} characters ({len(text)} given)"


def task_bounds(tool: Tool, limits: TaskLimits) -> dict[str, int]:
    """Each parameter of ``tool`` declared with a ``TaskBound`` -> its limit under ``limits``."""
    return {
        name: bound.of(limits)
        for name, info in _fields(adopt(tool)).items()
        for bound in info.metadata
        if isinstance(bound, TaskBound)
    }


def _schema_problems(metadata: FuncMetadata, known: dict[str, Any]) -> list[str]:
    """The model's problems with ``known``; text over its declared length is said as such,
    without the other arms of its union (an over-long record type is no integer either)."""
    try:
        metadata.arg_model.model_validate(metadata.pre_parse_json(known))
    except ValidationError as exc:
        errors = exc.errors()
    else:
        return []
    # a parameter whose own text is over its length: that one problem, no union arm's
    long = {
        str(e["loc"][0])
        for e in errors
        if e["type"] == "string_too_long" and e["input"] == known.get(str(e["loc"][0]))
    }
    found = []
    for e in errors:
        param = str(e["loc"][0])
        if param not in long:
            found.append(f"{_where(tuple(e['loc']))}: {_problem(e)}")
        elif e["type"] == "string_too_long":
            found.append(f"{_shown(param)}: {_problem(e)}")
    return found


def problems(
    tool: Tool, arguments: dict[str, Any], task_limits: TaskLimits | None = None
) -> list[str]:
    """Every problem with ``arguments`` for ``tool``, each naming its parameter; [] if none."""
    metadata = adopt(tool)
    fields = _fields(metadata)
    unknown = [name for name in arguments if name not in fields]
    found = [f"{_shown(name)}: unknown parameter" for name in unknown]
    if found:
        found[0] += f" (this tool takes {', '.join(fields) or 'none'})"
    known = {key: value for key, value in arguments.items() if key in fields}
    found += _schema_problems(metadata, known)
    named = {problem.split(":", 1)[0] for problem in found}
    bounds = task_bounds(tool, TaskLimits() if task_limits is None else task_limits)
    for name, limit in bounds.items():
        value = known.get(name)
        if isinstance(value, str) and len(value) > limit and name not in named:
            found.append(f"{name}: {_too_long(limit, value)}")
    return found


def refusal(found: list[str]) -> CallToolResult:
    """The ``invalid_argument`` error listing ``found`` (at most ``MAX_LISTED`` of them) in
    ``detail`` and, one by one, in ``problems`` (as the agent tools' own checks do)."""
    shown = found[:MAX_LISTED]
    more = [f"and {len(found) - MAX_LISTED} more"] if len(found) > MAX_LISTED else []
    return fail(
        "invalid_argument",
        "; ".join(shown + more),
        retryable=False,
        next_action="fix the named parameters (tools/list gives each one's type and range) "
        "and call again",
        problems=shown,
    )


def unknown_tool(name: str) -> CallToolResult:
    return fail(
        "unknown_tool",
        f"no tool named {name[:80]!r}",
        retryable=False,
        next_action="call one of the tools tools/list names",
    )
