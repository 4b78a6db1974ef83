"""A2A message parts to a mesh task's value and back (pure; the door's only reader of parts).

- Taken: text parts (joined by a newline) and data parts (JSON). One data part alone is the
  task's input as a JSON value; otherwise every part becomes text (a data part as compact JSON).
  An answer to a question (a message naming its task) is always text, as ``mesh_task_send``'s is.
- Refused (``ContentTypeNotSupportedError``): file parts (``raw`` bytes or a ``url``). The door
  never fetches a URL nor writes a file: nothing an A2A peer sends reaches a path or a shell.
- Refused (``InvalidParamsError``): no content, a boolean anywhere in data (the mesh's 0/1 rule),
  and anything past the mesh task bounds (``TaskLimits``: the same numbers as a mesh sender's).
- Whole numbers come back from ``google.protobuf.Value`` as floats: they are made ints again.
"""

from __future__ import annotations

import json
from typing import Any, Final

from a2a.helpers.proto_helpers import new_data_part, new_text_part
from a2a.types import Message, Part
from a2a.utils.errors import ContentTypeNotSupportedError, InvalidParamsError
from google.protobuf.json_format import MessageToDict

from macula.agent.task_messages import TaskLimits
from macula.store.task_values import TaskValue, compact_json, value_problems

TITLE_PREVIEW: Final = 80


def _whole(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, list):
        return [_whole(item) for item in value]
    if isinstance(value, dict):
        return {key: _whole(item) for key, item in value.items()}
    return value


def message_value(message: Message, limits: TaskLimits, *, answer: bool = False) -> TaskValue:
    """The mesh value ``message`` carries (text, or one JSON value), checked against ``limits``;
    ``answer``: an answer to a question (text only). Raises the A2A error it names."""
    texts: list[str] = []
    data: list[Any] = []
    for part in message.parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            texts.append(part.text)
        elif kind == "data":
            item = _whole(MessageToDict(part.data))
            problems = value_problems("data", item)
            if problems:
                raise InvalidParamsError(message="; ".join(problems))
            data.append(item)
            texts.append(compact_json(item))
        else:
            raise ContentTypeNotSupportedError(
                message="this agent takes text and data parts only; share a file's content "
                "as text, or by its mesh content id"
            )
    if not texts:
        raise InvalidParamsError(message="message: no text or data part")
    taken: TaskValue = "\n".join(texts)
    if len(message.parts) == 1 and data and not answer:
        taken = data[0]  # a JSON value, checked above
    if isinstance(taken, str) and not taken.strip():
        raise InvalidParamsError(message="message: its text is blank")
    problems = limits.problems(input=taken)
    if problems:
        raise InvalidParamsError(message="; ".join(problems))
    return taken


def title_for(client: str, value: TaskValue, limits: TaskLimits) -> str:
    """The mesh task's title: says it came through the A2A door, from which client, and what."""
    text = value if isinstance(value, str) else compact_json(value)
    first = " ".join(text.split())[:TITLE_PREVIEW] or "(data)"
    return f"A2A from {client}: {first}"[: limits.max_title_chars]


def value_part(value: TaskValue) -> Part:
    """A mesh result as one part: text as text, JSON as data."""
    if isinstance(value, str):
        return new_text_part(value, media_type="text/plain")
    return new_data_part(value, media_type="application/json")


def text_of(value: TaskValue) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
