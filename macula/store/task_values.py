"""A task's input and result: text, or a JSON value (A2A tasks carry data parts as well as text).

Invariants:
- a value is kept as given: text stays text (however JSON it looks), an object stays an object;
  the store records which it was (``encode`` / ``decode`` are inverse), so it comes back the
  same way to the requester, the assignee and every view;
- a JSON value is an object, an array or a number whose members are text, finite numbers,
  null, arrays and objects with text keys, nested at most ``MAX_DEPTH`` levels; never a
  boolean (the wire rule: 0/1), never a top-level null (that means "no value");
- its size (``value_bytes``) is what its bound counts: text's UTF-8 bytes, else those of its
  compact JSON text (no spaces, UTF-8).
No I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, TypeAlias

TaskValue: TypeAlias = str | int | float | list[Any] | dict[str, Any]
MAX_DEPTH = 32


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def value_bytes(value: TaskValue) -> int:
    text = value if isinstance(value, str) else compact_json(value)
    return len(text.encode("utf-8", "surrogatepass"))


def value_problems(name: str, value: object) -> list[str]:
    """Every reason ``value`` cannot be a task's input or result, each naming its path."""
    if value is None:
        return [f"{name}: null is not a value (omit it instead)"]
    found: list[str] = []
    stack: list[tuple[object, str, int]] = [(value, name, 0)]
    while stack and len(found) < 10:
        item, path, depth = stack.pop()
        if type(item) is bool:
            found.append(f"{path}: booleans are not allowed; use 0/1")
        elif isinstance(item, float) and not math.isfinite(item):
            found.append(f"{path}: a number must be finite")
        elif isinstance(item, (list, dict)) and depth >= MAX_DEPTH:
            found.append(f"{path}: nested deeper than {MAX_DEPTH} levels")
        elif isinstance(item, list):
            stack.extend((sub, f"{path}[{i}]", depth + 1) for i, sub in enumerate(item))
        elif isinstance(item, dict):
            for key, sub in item.items():
                if not isinstance(key, str):
                    found.append(f"{path}: object keys must be text")
                    break
                stack.append((sub, f"{path}.{key}", depth + 1))
        elif item is not None and type(item) not in (str, int, float):
            found.append(f"{path}: expected text or a JSON value, not {type(item).__name__}")
    return found


def value_of(body: Mapping[str, Any], key: str) -> TaskValue | None:
    """``body[key]`` if it is a task value (text or a valid JSON value), else ``None``."""
    value = body.get(key)
    if value is None or value_problems(key, value):
        return None
    assert isinstance(value, (str, int, float, list, dict))
    return value


def encode(value: TaskValue | None) -> tuple[str | None, int]:
    """What the store keeps: the text, and 1 when it is a JSON value's text (0: plain text)."""
    if value is None or isinstance(value, str):
        return value, 0
    return compact_json(value), 1


def decode(text: object, is_json: object) -> TaskValue | None:
    """The value ``encode`` kept."""
    if text is None:
        return None
    if is_json == 1:
        decoded: TaskValue = json.loads(str(text))
        return decoded
    return str(text)
