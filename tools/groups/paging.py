"""Pages: every tool result that lists items is a bounded page, cut between items.

The one rule (docs/paging.md; the server's instructions say it too): a result that lists items
carries ``remaining`` (how many more items there are past this page) and ``next_page`` (null
when ``remaining`` is 0, else ``{tool, arguments}``: the call that returns the next page).
Calling ``next_page`` again and again reaches every item exactly once. A tool that marks what
it returns read (``mesh_read_inbox``, ``mesh_wait_room``) marks only what its page holds.

Invariants:
- A page is cut between items, never inside a list of a room or thread: ``PageBudget`` admits
  items in order while their JSON fits in ``PAGE_CHARS``, the first always, and stops at the
  first that does not fit;
- an item whose JSON alone is over ``ITEM_CHARS`` is shortened (its ``text`` cut) to fit, and
  says so: ``text_truncated`` 1, ``text_chars`` (the whole length) and ``text_next_page`` (the call
  that returns the rest of the text);
- sizes are characters of ``json.dumps(..., ensure_ascii=False)``, as ``tools.server.results``
  measures them, so a page plus its other keys stays under ``MAX_RESULT_BYTES``;
- cursors are opaque to the model and checked: ``s<seq>`` (an inbox page after ``seq``) and
  ``t<seq>.<offset>`` (a message's text from ``offset``); anything else is ``invalid_argument``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from tools.server.results import MAX_RESULT_BYTES, InvalidArgument

PAGE_CHARS: Final = MAX_RESULT_BYTES - 4_096  # the rest is for the result's other keys
ITEM_CHARS: Final = 18_000  # one item alone: a 16 KiB say fits whole unless heavily escaped
TEXT_CHUNK_CHARS: Final = 12_000  # a text read in parts: the JSON of one part at most this
_CURSOR = re.compile(r"(?:s(\d{1,18})|t(\d{1,18})\.(\d{1,9}))\Z")


def size(value: Any) -> int:
    """Characters of ``value`` as JSON, as ``tools.server.results`` measures a result."""
    return len(json.dumps(value, ensure_ascii=False, default=str))


class PageBudget:
    """Admits items in order while they fit (the first always); then admits nothing more."""

    def __init__(self, limit: int = PAGE_CHARS) -> None:
        self.left = limit
        self.admitted = 0
        self.closed = False

    def admit(self, chars: int) -> bool:
        if self.closed:
            return False
        if self.admitted and chars > self.left:
            self.closed = True
            return False
        self.left -= chars
        self.admitted += 1
        return True

    def fit(self, sizes: Iterable[int]) -> int:
        """How many of the leading items (by their sizes) the page admits."""
        taken = 0
        for chars in sizes:
            if not self.admit(chars):
                break
            taken += 1
        return taken


def next_call(tool: str, arguments: dict[str, Any] | None) -> dict[str, Any] | None:
    """``next_page`` of a page: the call for the next page, or None when nothing remains."""
    if arguments is None:
        return None
    return {"tool": tool, "arguments": {k: v for k, v in arguments.items() if v is not None}}


def paged(remaining: int, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """``remaining`` and ``next_page`` of a page (``arguments``: of the next call)."""
    return {"remaining": remaining, "next_page": next_call(tool, arguments if remaining else None)}


@dataclass(frozen=True, slots=True)
class Cursor:
    seq: int
    text_offset: int | None = None  # a message's text from here (None: a page after ``seq``)


def page_cursor(seq: int) -> str:
    return f"s{seq}"


def text_cursor(seq: int, offset: int) -> str:
    return f"t{seq}.{offset}"


def parse_cursor(cursor: str) -> Cursor:
    """A cursor a page handed out; ``InvalidArgument`` for anything else."""
    found = _CURSOR.match(cursor) if isinstance(cursor, str) else None
    if found is None:
        raise InvalidArgument(
            "cursor: not one this server handed out; pass the cursor from a page's next_page"
            " (or omit it for the first page)"
        )
    if found.group(1) is not None:
        return Cursor(int(found.group(1)))
    return Cursor(int(found.group(2)), int(found.group(3)))


def shortened(
    view: dict[str, Any],
    continuation: Callable[[int], dict[str, Any] | None],
    limit: int = ITEM_CHARS,
) -> dict[str, Any]:
    """``view`` whole if its JSON fits in ``limit``; else with ``text`` cut so it does, and
    ``text_truncated`` 1, ``text_chars``, ``text_next_page`` (``continuation(offset)``: the call
    that returns the text from where it was cut)."""
    if size(view) <= limit:
        return view
    text = view.get("text")
    if not isinstance(text, str):
        return view
    marked = view | {
        "text": "",
        "text_truncated": 1,
        "text_chars": len(text),
        "text_next_page": continuation(len(text)),
    }
    room = limit - size(marked)
    cut = text_prefix(text, room)
    return marked | {"text": text[:cut], "text_next_page": continuation(cut)}


def text_prefix(text: str, chars: int, start: int = 0) -> int:
    """The end of the longest ``text[start:end]`` whose JSON string takes at most ``chars``
    characters (at least one character past ``start`` when ``text`` has one)."""
    low, high = start, len(text)
    while low < high:  # the greatest end that fits
        middle = (low + high + 1) // 2
        if size(text[start:middle]) <= chars:
            low = middle
        else:
            high = middle - 1
    return max(low, min(start + 1, len(text)))
