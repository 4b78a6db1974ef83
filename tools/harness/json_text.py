"""Surgical edits of JSON (and JSONC) text: one member set or removed, every other byte kept.

Harness configuration files are the user's: their indentation, key order, comments (JSONC) and
whatever else the harness keeps there (``~/.claude.json`` holds far more than MCP servers) must
survive a ``register``. So nothing here re-serializes a document: a small parser finds the spans
of objects and members, and an edit splices text at those spans.

Invariants:
- ``set_member`` then ``remove_member`` of a member that was absent gives the text back byte for
  byte when the container object already existed and had members (the inserted text is exactly
  the removed text); otherwise the result is equal as data.
- a text that does not parse raises ``JsonTextError`` naming the line and column; no edit is
  made on a text that does not parse.
- comments and trailing commas are accepted only when ``jsonc`` is true; any text either parses
  or raises ``JsonTextError`` (nesting is bounded by ``MAX_DEPTH``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_WHITESPACE = " \t\r\n"
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None}
MAX_DEPTH = 256  # deeper nesting is refused with an error, not a RecursionError


class JsonTextError(ValueError):
    """The text is not valid JSON (or JSONC); the message names the line and column."""


@dataclass(frozen=True, slots=True)
class Member:
    key: str
    key_start: int
    value: Node
    comma_end: int | None  # just past the comma that follows the value, if any


@dataclass(frozen=True, slots=True)
class Node:
    start: int
    end: int
    value: Any  # the decoded Python value
    members: tuple[Member, ...] = ()  # objects only

    @property
    def is_object(self) -> bool:
        return isinstance(self.value, dict)

    def member(self, key: str) -> Member | None:
        found = [m for m in self.members if m.key == key]
        return found[-1] if found else None  # as json.loads: the last duplicate wins


class _Parser:
    def __init__(self, text: str, jsonc: bool) -> None:
        self.text = text
        self.jsonc = jsonc
        self.pos = 0
        self.depth = 0

    def fail(self, what: str, pos: int | None = None) -> JsonTextError:
        at = self.pos if pos is None else pos
        line = self.text.count("\n", 0, at) + 1
        column = at - (self.text.rfind("\n", 0, at) + 1) + 1
        return JsonTextError(f"{what} at line {line} column {column}")

    def skip(self) -> None:
        text = self.text
        while self.pos < len(text):
            char = text[self.pos]
            if char in _WHITESPACE:
                self.pos += 1
            elif self.jsonc and text.startswith("//", self.pos):
                newline = text.find("\n", self.pos)
                self.pos = len(text) if newline < 0 else newline + 1
            elif self.jsonc and text.startswith("/*", self.pos):
                close = text.find("*/", self.pos + 2)
                if close < 0:
                    raise self.fail("unterminated comment")
                self.pos = close + 2
            else:
                return

    def document(self) -> Node:
        self.skip()
        node = self.value()
        self.skip()
        if self.pos != len(self.text):
            raise self.fail("extra data after the document")
        return node

    def value(self) -> Node:
        text = self.text
        if self.pos >= len(text):
            raise self.fail("unexpected end of text")
        char = text[self.pos]
        if char in "{[":
            if self.depth >= MAX_DEPTH:
                raise self.fail(f"nested deeper than {MAX_DEPTH} levels")
            self.depth += 1
            node = self.object() if char == "{" else self.array()
            self.depth -= 1
            return node
        if char == '"':
            start = self.pos
            decoded = self.string()
            return Node(start, self.pos, decoded)
        for word, literal in _LITERALS.items():
            if text.startswith(word, self.pos):
                start, self.pos = self.pos, self.pos + len(word)
                return Node(start, self.pos, literal)
        match = _NUMBER.match(text, self.pos)
        if match is None or match.end() == self.pos:
            raise self.fail(f"unexpected character {char!r}")
        start, self.pos = self.pos, match.end()
        return Node(start, self.pos, json.loads(match.group()))

    def string(self) -> str:
        decoder = json.JSONDecoder()
        try:
            decoded, end = decoder.raw_decode(self.text, self.pos)
        except json.JSONDecodeError as exc:
            raise self.fail(f"bad string ({exc.msg})") from None
        self.pos = end
        assert isinstance(decoded, str)
        return decoded

    def object(self) -> Node:
        start = self.pos
        self.pos += 1
        members: list[Member] = []
        decoded: dict[str, Any] = {}
        self.skip()
        while not self.text.startswith("}", self.pos):
            if members and members[-1].comma_end is None:
                raise self.fail("expected ',' or '}'")
            if self.pos >= len(self.text) or self.text[self.pos] != '"':
                raise self.fail("expected a quoted key")
            key_start = self.pos
            key = self.string()
            self.skip()
            if not self.text.startswith(":", self.pos):
                raise self.fail("expected ':'")
            self.pos += 1
            self.skip()
            value = self.value()
            self.skip()
            comma_end = None
            if self.text.startswith(",", self.pos):
                self.pos += 1
                comma_end = self.pos
                self.skip()
            members.append(Member(key, key_start, value, comma_end))
            decoded[key] = value.value
        if members and members[-1].comma_end is not None and not self.jsonc:
            raise self.fail("trailing comma", members[-1].comma_end - 1)
        self.pos += 1
        return Node(start, self.pos, decoded, tuple(members))

    def array(self) -> Node:
        start = self.pos
        self.pos += 1
        items: list[Any] = []
        comma = True
        self.skip()
        while not self.text.startswith("]", self.pos):
            if not comma:
                raise self.fail("expected ',' or ']'")
            items.append(self.value().value)
            self.skip()
            comma = self.text.startswith(",", self.pos)
            if comma:
                self.pos += 1
                self.skip()
                if self.text.startswith("]", self.pos) and not self.jsonc:
                    raise self.fail("trailing comma", self.pos - 1)
        self.pos += 1
        return Node(start, self.pos, items)


def parse(text: str, *, jsonc: bool = False) -> Node:
    """The document's tree of spans; ``JsonTextError`` names where it stops being JSON."""
    return _Parser(text, jsonc).document()


def _line_indent(text: str, pos: int) -> str:
    """The whitespace that starts the line holding ``pos``."""
    line_start = text.rfind("\n", 0, pos) + 1
    line = text[line_start:pos]
    return line[: len(line) - len(line.lstrip(" \t"))]


def _on_own_line(text: str, pos: int) -> bool:
    line_start = text.rfind("\n", 0, pos) + 1
    return text[line_start:pos].strip(" \t") == ""


def _indent_unit(text: str) -> str:
    """The document's indentation step: the first indented line's, else two spaces."""
    match = re.search(r"\n([ \t]+)\S", text)
    return match.group(1) if match else "  "


def _render(value: Any, indent: str, unit: str, newline: str, one_line: bool) -> str:
    if one_line:
        return json.dumps(value, ensure_ascii=False)
    rendered = json.dumps(value, indent=unit, ensure_ascii=False)
    return rendered.replace("\n", newline + indent)


def _wrap(path: tuple[str, ...], name: str, value: Any) -> tuple[str, Any]:
    """``path`` = (a, b) and name n: the member ``a`` holding ``{b: {n: value}}``."""
    wrapped: Any = value
    for key in (*path[1:], name)[::-1]:
        wrapped = {key: wrapped}
    return path[0] if path else name, wrapped if path else value


def _container(root: Node, path: tuple[str, ...]) -> tuple[Node, tuple[str, ...]]:
    """The deepest existing object along ``path``, and the keys still missing below it."""
    if not root.is_object:
        raise JsonTextError("the document is not a JSON object")
    node = root
    for depth, key in enumerate(path):
        member = node.member(key)
        if member is None:
            return node, path[depth:]
        if not member.value.is_object:
            raise JsonTextError(f"{'.'.join(path[: depth + 1])} is not an object")
        node = member.value
    return node, ()


def member_value(text: str, path: tuple[str, ...], name: str, *, jsonc: bool = False) -> Any:
    """The decoded value at ``path``/``name``, or ``None`` when absent."""
    node, missing = _container(parse(text, jsonc=jsonc), path)
    if missing:
        return None
    member = node.member(name)
    return None if member is None else member.value.value


def _line_tail(text: str, pos: int) -> int:
    """Past a comment or blanks that end the line at ``pos`` (where a new line may go), else
    ``pos`` itself."""
    newline = text.find("\n", pos)
    end = len(text) if newline < 0 else newline
    if end > pos and text[end - 1] == "\r":
        end -= 1
    tail = text[pos:end].strip(" \t")
    return end if tail == "" or tail.startswith("//") else pos


def set_member(text: str, path: tuple[str, ...], name: str, value: Any, *, jsonc: bool) -> str:
    """``text`` with ``path``/``name`` set to ``value``; objects on the path made as needed.
    A new member goes after the last one, on its own line at the same indentation (after any
    comment ending the last member's line), or inline when the object is written on one line."""
    root = parse(text, jsonc=jsonc)
    node, missing = _container(root, path)
    newline = "\r\n" if "\r\n" in text else "\n"
    unit = _indent_unit(text)
    key, new_value = _wrap(missing, name, value) if missing else (name, value)
    one_line = "\n" not in text[node.start : node.end]
    existing = node.member(key)
    if existing is not None:  # replace the value in place, at the key's indentation
        indent = _line_indent(text, existing.key_start)
        rendered = _render(new_value, indent, unit, newline, one_line)
        return text[: existing.value.start] + rendered + text[existing.value.end :]
    if not node.members:
        if one_line:
            member = f"{json.dumps(key)}: {_render(new_value, '', unit, newline, True)}"
            return text[: node.start + 1] + member + text[node.end - 1 :]
        outer = _line_indent(text, node.start)
        indent = outer + unit
        member = f"{json.dumps(key)}: {_render(new_value, indent, unit, newline, False)}"
        close = node.end - 1
        return text[: node.start + 1] + newline + indent + member + newline + outer + text[close:]
    last = node.members[-1]
    own_lines = _on_own_line(text, last.key_start) and not one_line
    indent = _line_indent(text, last.key_start) if own_lines else ""
    lead = newline + indent if own_lines else " "
    member = f"{json.dumps(key)}: {_render(new_value, indent, unit, newline, not own_lines)}"
    if last.comma_end is not None:  # trailing-comma style (JSONC): keep it
        at = _line_tail(text, last.comma_end) if own_lines else last.comma_end
        return text[:at] + lead + member + "," + text[at:]
    end = last.value.end
    at = _line_tail(text, end) if own_lines else end
    return text[:end] + "," + text[end:at] + lead + member + text[at:]


def remove_member(text: str, path: tuple[str, ...], name: str, *, jsonc: bool) -> str:
    """``text`` without ``path``/``name`` (unchanged when absent); the inverse of an insert."""
    node, missing = _container(parse(text, jsonc=jsonc), path)
    found = [i for i, m in enumerate(node.members) if m.key == name]
    if missing or not found:
        return text
    index = found[-1]
    members = node.members
    this = members[index]
    if len(members) == 1:
        return text[: node.start + 1] + text[node.end - 1 :]
    if index + 1 < len(members):  # not last: up to the next key, comma and space included
        return text[: this.key_start] + text[members[index + 1].key_start :]
    previous = members[index - 1]
    assert previous.comma_end is not None
    at = _line_tail(text, previous.comma_end)
    if this.comma_end is not None:
        return text[:at] + text[this.comma_end :]
    comma = previous.comma_end - 1
    return text[:comma] + text[previous.comma_end : at] + text[this.value.end :]


def new_document(path: tuple[str, ...], name: str, value: Any) -> str:
    """A fresh file holding only ``path``/``name``: two-space indentation, final newline."""
    key, wrapped = _wrap(path, name, value)
    return json.dumps({key: wrapped}, indent=2, ensure_ascii=False) + "\n"
