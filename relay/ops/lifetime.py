"""When a station started for one user's session should end by itself.

A local station (``macula-mcp`` starts one per ``MACULA_HOME``) outlives the session that
started it, so nothing else would ever stop it. It ends itself when:

- the folder it was told to watch (``--exit-when-gone PATH``: its data dir) is gone: its home
  was deleted, so nobody can reach it pinned any more and it holds its port for nothing;
- nobody used it for ``--idle-exit-s`` seconds: no connection was open during that time.

Invariants:
- the rule (``LifetimeRule.verdict``) is pure: it is given the time, whether the path exists
  and how many connections are open, and answers a reason to exit or None;
- "used" means a connection (client, link or probe) was open at a check; a station with an
  open connection is never idle;
- the watcher (``watch``) only stats one path and reads a count every ``check_s`` seconds;
  it sets the station's stop event, so the station exits as on SIGTERM (GOODBYE, files removed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

log = logging.getLogger("macula.relay")

DEFAULT_CHECK_S: Final = 2.0  # how often the watcher looks (a stat and a count)


@dataclass
class LifetimeRule:
    """The exit rule of one station: a path that must exist, an idle budget (None: either
    check off). ``last_used`` is when a connection was last seen open."""

    watched: Path | None = None
    idle_exit_s: float | None = None
    last_used: float = field(default=0.0)

    def verdict(self, now: float, watched_exists: bool, connections: int) -> str | None:
        """A sentence saying why the station should exit now, or None."""
        if self.watched is not None and not watched_exists:
            return f"{self.watched} is gone (its home was removed)"
        if connections > 0:
            self.last_used = now
            return None
        if self.idle_exit_s is not None and now - self.last_used >= self.idle_exit_s:
            return f"no connection for {self.idle_exit_s:g} s"
        return None

    @property
    def active(self) -> bool:
        return self.watched is not None or self.idle_exit_s is not None


def exists(path: Path) -> bool:
    """True unless ``path`` is certainly gone (an unreadable parent is not "gone")."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return True


async def watch(
    rule: LifetimeRule,
    connections: Callable[[], int],
    stop: asyncio.Event,
    *,
    check_s: float = DEFAULT_CHECK_S,
    clock: Callable[[], float] = time.monotonic,
) -> str | None:
    """Check ``rule`` every ``check_s`` seconds until it says exit (then ``stop`` is set and
    the reason returned) or ``stop`` is set by someone else (None)."""
    rule.last_used = clock()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), check_s)
        if stop.is_set():
            return None
        watched = rule.watched
        reason = rule.verdict(clock(), watched is None or exists(watched), connections())
        if reason is not None:
            log.info("exiting by itself: %s", reason)
            stop.set()
            return reason
    return None
