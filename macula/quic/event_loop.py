"""Which asyncio event loop a process entry point runs on: uvloop when installed, else asyncio's.

Invariants:
- ``run(coro)`` is ``asyncio.run`` with the loop ``MACULA_LOOP`` selects: unset, empty or ``auto``
  takes uvloop when it is importable (``macula-mesh[fast]``) and asyncio's loop otherwise;
  ``asyncio`` always takes asyncio's; ``uvloop`` requires uvloop. Any other value, or ``uvloop``
  when it is not installed, raises ``EventLoopError`` naming the fix; nothing falls back silently;
- only process entry points call ``run``; library code never creates a loop.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from macula.config import LOOP_ENV, choice_setting
from macula.errors import ConfigError

ENV = LOOP_ENV
CHOICES = ("auto", "asyncio", "uvloop")

T = TypeVar("T")


class EventLoopError(ConfigError):
    """``MACULA_LOOP`` names an event loop that is unknown or not installed."""


def loop_factory(
    environ: Mapping[str, str] = os.environ,
) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop constructor ``MACULA_LOOP`` selects; None for asyncio's default loop."""
    value = choice_setting(environ, ENV, CHOICES, EventLoopError)
    if value == "asyncio":
        return None
    try:
        import uvloop
    except ImportError as exc:
        if value == "uvloop":
            raise EventLoopError(
                f"{ENV}=uvloop but uvloop is not importable ({exc}); "
                f"install macula-mesh[fast] or unset {ENV}"
            ) from exc
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def loop_name(environ: Mapping[str, str] = os.environ) -> str:
    """``uvloop`` or ``asyncio``: what ``run`` would use."""
    return "asyncio" if loop_factory(environ) is None else "uvloop"


def run(main: Coroutine[Any, Any, T], environ: Mapping[str, str] = os.environ) -> T:
    """Run ``main`` to completion on a new loop of the selected kind (see ``asyncio.run``)."""
    try:
        factory = loop_factory(environ)
    except EventLoopError:
        main.close()  # never awaited: say so quietly instead of a RuntimeWarning
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
