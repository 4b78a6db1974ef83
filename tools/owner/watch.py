"""Noticing a change to ``owner.toml`` without a restart: whoever wrote it (the CLI, the
console, a person with an editor).

Invariants:
- ``check`` is cheap: one ``stat``; the file is read only when its (inode, size, mtime)
  changed, or while its mtime is within ``RACY_S`` of now (``clock``, injectable: an edit
  inside one timestamp tick keeps size and mtime), and a read counts as a change only when
  the bytes' hash differs;
- ``check`` says whether this session's effective switches changed (what ``tools/list``
  shows), not merely whether the file did: a comment edit notifies nobody;
- a malformed file is said on stderr (the log) once per content, per process, however many
  sessions watch it and however often they check.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from tools.owner.policy import Problem, Switches
from tools.owner.store import Loaded, load

log = logging.getLogger("macula.tools.owner")

RACY_S: Final = 2.0
POLL_S: Final = 0.5  # how often a session's watcher checks (tools.owner.switchboard)

_said: dict[str, str] = {}  # path -> hash of the malformed content last said on stderr

Signature = tuple[int, int, int] | None


def _signature(path: Path) -> Signature:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError:
        return (-1, -1, -1)  # unreadable: read (and fail closed) every time
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class PolicySource:
    """The owner's switches for one session of ``agent``, kept current from ``path``."""

    def __init__(
        self, path: Path, agent: str | None, clock: Callable[[], float] = time.time
    ) -> None:
        self.path, self.agent, self.clock = path, agent, clock
        self._signature: Signature = None
        self._hash: str | None = None
        self._loaded = Loaded(None, None)
        self.switches: Switches = self._loaded.switches(agent)
        self.generation = 0  # one more at each change of the switches
        self._read()

    def _read(self) -> None:
        self._signature = _signature(self.path)
        loaded = load(self.path)
        self._hash = None if loaded.data is None else hashlib.sha256(loaded.data).hexdigest()
        self._loaded = loaded
        self.switches = loaded.switches(self.agent)
        problem = loaded.found if isinstance(loaded.found, Problem) else None
        if problem is not None and _said.get(str(self.path)) != self._hash:
            _said[str(self.path)] = self._hash or ""
            log.error(
                "owner.toml is malformed, every switchable tool is off until it is fixed: %s",
                problem.text(),
            )
        elif problem is None:
            _said.pop(str(self.path), None)

    def _racy(self) -> bool:
        sig = self._signature
        return sig is not None and sig[2] >= 0 and self.clock() - sig[2] / 1e9 < RACY_S

    def check(self) -> bool:
        """Re-read the file if it may have changed; whether the switches changed."""
        sig = _signature(self.path)
        if sig == self._signature and sig != (-1, -1, -1) and not self._racy():
            return False
        before_hash, before = self._hash, self.switches
        if sig is None and self._hash is None:
            self._signature = None
            return False
        self._read()
        if self._hash == before_hash and sig != (-1, -1, -1):
            return False
        changed = (self.switches.on, self.switches.problem) != (before.on, before.problem)
        self.generation += int(changed)
        return changed

    def current(self) -> Switches:
        """The switches now (checked first: every call sees the file as it is)."""
        self.check()
        return self.switches
