"""The first answer on stdio, given before the MCP SDK is imported (it costs 1-1.5 s here).

A harness spawns ``macula-mcp`` (or ``macula-mcp attach``) and sends one opening request:
``server/discover`` (a 2026-07-28 client probing for the modern era, on a budget: Claude
Code allows about 2 s, then kills and respawns the server) or ``initialize`` (the 2025
handshake). The front reads stdin on a thread from the first milliseconds, answers that
opening request itself when it can, and hands everything else, in order, to the backend: the
SDK server in this process (plain form) or the daemon (attach form).

The era, on purpose (``opening``):
- with channel push on (``MACULA_MCP_CHANNEL``, default 1) a ``server/discover`` is declined
  at once with ``-32022`` (unsupported protocol version) naming the handshake versions served,
  and not passed on: the client falls back to ``initialize`` on the same process. Claude Code
  drops ``claude/channel`` on a 2026-07-28 connection, so push needs the 2025-11-25 era;
- with push off the discover goes to the backend, which serves the 2026-07-28 era;
- a client pinned to 2026-07-28 (no discover, enveloped requests from the start) is served by
  the backend in that era either way.

The card (``HandshakeCard``): the backend's own answers to ``initialize`` (per negotiated
version) and ``server/discover``, learned from the backend's replies, kept in
``$MACULA_HOME/cache/handshake.json`` (0600) under a fingerprint of the code and the settings
that shape them. With a card the front answers the opening request from it at once, still
passes the request on, and drops the backend's own reply to it (relearning the card when that
reply differs). Without one (a new home, new code) the shipped seed answers ``initialize``
(``tools/stdio/handshake_seed.json``, made by ``python -m tools.stdio.handshake_seed`` and checked
by tests
to be this code's own answer); without either the backend answers, and is learned.

Invariants: stdlib only (nothing heavy is imported here; the card's writer,
``macula.private_file``, is imported when a card is written); one writer lock on the wire; a
line that is not JSON, or not an opening request, is passed on untouched, in order.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tools.settings import DEFAULT_HOME, HOME_ENV, channel_text, terse_text

CARD_FILE: Final = Path("cache") / "handshake.json"
SEED_FILE: Final = (
    Path(__file__).resolve().with_name("handshake_seed.json")
)  # tools.stdio.handshake_seed
# mcp_types.version's, without importing it (a test keeps them equal)
HANDSHAKE_VERSIONS: Final = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
UNSUPPORTED_PROTOCOL_VERSION: Final = -32022
MAX_OPENING_LINE: Final = 1 << 20  # a longer first line is passed on unparsed
CHUNK: Final = 65536

Message = dict[str, Any]


def channel_on(env: Mapping[str, str]) -> bool:
    return channel_text(env) != "0"


def negotiated(requested: object) -> str:
    """The handshake version the SDK server agrees to for ``requested``."""
    return (
        requested
        if isinstance(requested, str) and requested in HANDSHAKE_VERSIONS
        else (HANDSHAKE_VERSIONS[-1])
    )


def card_key(message: Message) -> str | None:
    """Which card entry answers this opening request (None: none can)."""
    method, params = message.get("method"), message.get("params") or {}
    if not isinstance(params, dict):
        return None
    if method == "initialize":
        return f"initialize {negotiated(params.get('protocolVersion'))}"
    meta = params.get("_meta")
    if method == "server/discover" and isinstance(meta, dict):
        version = meta.get("io.modelcontextprotocol/protocolVersion")
        return f"discover {version}" if isinstance(version, str) else None
    return None


@dataclass(frozen=True)
class Decision:
    """What the front does with the opening request: ``answer`` it now (a whole JSON-RPC
    response) or not, pass it on to the backend or not, and which card entry it is."""

    answer: Message | None
    forward: bool
    key: str | None = None


def opening(message: Message, env: Mapping[str, str], answers: Mapping[str, Any]) -> Decision:
    """The decision for one request that opens the session (pure)."""
    ident, method = message.get("id"), message.get("method")
    if method == "server/discover" and channel_on(env):
        requested = ((message.get("params") or {}).get("_meta") or {}).get(
            "io.modelcontextprotocol/protocolVersion"
        )
        data: Message = {"supported": list(HANDSHAKE_VERSIONS)}
        if isinstance(requested, str):
            data["requested"] = requested
        error = {
            "code": UNSUPPORTED_PROTOCOL_VERSION,
            "message": "this server pushes into the session (claude/channel), which needs the "
            "initialize handshake: use protocol version 2025-11-25",
            "data": data,
        }
        return Decision({"jsonrpc": "2.0", "id": ident, "error": error}, forward=False)
    key = card_key(message)
    known = answers.get(key) if key is not None else None
    if isinstance(known, dict):
        return Decision({"jsonrpc": "2.0", "id": ident, "result": known}, True, key)
    return Decision(None, True, key)


def fingerprint(env: Mapping[str, str]) -> str:
    """What the card's answers depend on: this code, the SDK's, and the settings that shape
    the server (a stat per file: no import, no read)."""
    digest = hashlib.sha256()
    digest.update(f"{channel_on(env)}|{terse_text(env)}|{sys.version_info[:2]}".encode())
    tools = Path(__file__).resolve().parents[1]  # every module of tools/, in its packages
    files = sorted(tools.rglob("*.py"))
    for package in ("mcp", "mcp_types"):  # the SDK: its server and its wire types
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.origin:
            files.append(Path(spec.origin))
    for path in files:
        with contextlib.suppress(OSError):
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()[:32]


def installed_mcp() -> str | None:
    """The installed ``mcp`` distribution's version, from its dist-info folder's name (no import,
    no metadata parse: ``importlib.metadata`` costs ~60 ms here)."""
    spec = importlib.util.find_spec("mcp")
    if spec is None or not spec.origin:
        return None
    found = sorted(Path(spec.origin).parent.parent.glob("mcp-*.dist-info"))
    return found[0].name[len("mcp-") : -len(".dist-info")] if len(found) == 1 else None


def seed_answers(env: Mapping[str, str], path: Path = SEED_FILE) -> dict[str, Any]:
    """The shipped card's answers for this channel setting; {} when it was made with another
    ``mcp`` than the installed one, or is missing or malformed."""
    with contextlib.suppress(OSError, ValueError):
        stored = json.loads(path.read_bytes())
        if isinstance(stored, dict) and stored.get("mcp") == installed_mcp():
            answers = (stored.get("channel") or {}).get("1" if channel_on(env) else "0")
            if isinstance(answers, dict):
                return answers
    return {}


class HandshakeCard:
    """The backend's answers to opening requests, remembered for the next spawn; before the
    first one is learned in this home, the shipped seed's (``seed_answers``)."""

    def __init__(self, env: Mapping[str, str], seed: Path = SEED_FILE) -> None:
        raw = env.get(HOME_ENV)
        home = Path(raw if raw else DEFAULT_HOME).expanduser()
        self.path = home / CARD_FILE
        self.print = fingerprint(env)
        self.learned: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            stored = json.loads(self.path.read_bytes())
            if isinstance(stored, dict) and stored.get("fingerprint") == self.print:
                answers = stored.get("answers")
                self.learned = answers if isinstance(answers, dict) else {}
        self.answers: dict[str, Any] = {**seed_answers(env, seed), **self.learned}

    def learn(self, key: str, result: Any) -> bool:
        """Remember ``result`` under ``key``; True when it differs from the answer held (learned
        or seeded). A seeded answer confirmed is written down too, so the home has its card."""
        changed: bool = self.answers.get(key) != result
        if not changed and self.learned.get(key) == result:
            return False
        self.answers[key] = self.learned[key] = result
        with contextlib.suppress(OSError):
            from macula.private_file import write_private  # stdlib only, off the opening path

            text = json.dumps({"fingerprint": self.print, "answers": self.learned})
            write_private(self.path, text.encode())
        return changed


Deliver = Callable[[bytes | None], None]  # a line for the backend, None at end of input


class Front:
    """Reads the harness's stdin from spawn on; answers the opening request when it can."""

    def __init__(self, env: Mapping[str, str], wire_in: int = 0, wire_out: int = 1) -> None:
        self.env = dict(env)
        self.card = HandshakeCard(env)
        self.wire_in, self.wire_out = wire_in, wire_out
        self._write_lock = threading.Lock()
        self._hand_lock = threading.Lock()
        self._backlog: list[bytes | None] = []
        self._deliver: Deliver | None = None
        self._opening = True
        self._watched: dict[Any, tuple[str, bool]] = {}  # id -> (card key, answered already)
        self.answered = threading.Event()  # the front answered a request itself
        self._thread = threading.Thread(target=self._read, name="stdio-front", daemon=True)

    def start(self) -> Front:
        self._thread.start()
        return self

    # -- the harness side (the reader thread) ----------------------------------------------

    def _read(self) -> None:
        pending = b""
        try:
            while chunk := os.read(self.wire_in, CHUNK):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._line(line + b"\n")
        except OSError:
            pass
        if pending:
            self._line(pending)
        self._hand(None)

    def _line(self, line: bytes) -> None:
        if self._opening and len(line) <= MAX_OPENING_LINE:
            try:
                message = json.loads(line)
            except (ValueError, RecursionError):  # nested too deep: stdio_guard answers it
                message = None
            request = isinstance(message, dict) and "method" in message and "id" in message
            if request and not self._open(message):
                return
        self._hand(line)

    def _open(self, message: Message) -> bool:
        """Handle the opening request; True when it goes on to the backend."""
        decision = opening(message, self.env, self.card.answers)
        if decision.answer is not None:
            self.write(json.dumps(decision.answer).encode() + b"\n")
            self.answered.set()
        if not decision.forward:
            return False  # declined: the next request opens the session
        self._opening = False
        if decision.key is not None:
            self._watched[json.dumps(message["id"])] = (decision.key, decision.answer is not None)
        return True

    def _hand(self, line: bytes | None) -> None:
        with self._hand_lock:
            if self._deliver is None:
                self._backlog.append(line)
            else:
                self._deliver(line)

    # -- the backend side ------------------------------------------------------------------

    def connect(self, deliver: Deliver) -> None:
        """From now on lines go to ``deliver`` (the backlog first, in order)."""
        with self._hand_lock:
            backlog, self._backlog = self._backlog, []
            for line in backlog:
                deliver(line)
            self._deliver = deliver

    @property
    def watching(self) -> bool:
        """A backend reply still to look at (learn, and drop when already answered)."""
        return bool(self._watched)

    def from_backend(self, line: bytes) -> bytes | None:
        """A line the backend wrote: the line to send on, or None to drop it (the front
        answered that request already)."""
        if not self._watched:
            return line
        try:
            message = json.loads(line)
        except ValueError:
            return line
        ident = json.dumps(message.get("id")) if isinstance(message, dict) else None
        watched = self._watched.pop(ident, None) if ident is not None else None
        if watched is None:
            return line
        key, answered = watched
        if "result" in message:
            changed = self.card.learn(key, message["result"])
            if changed and answered:
                print(f"macula-mcp: the remembered {key} answer was stale; relearned it "
                      f"({self.card.path})", file=sys.stderr, flush=True)  # fmt: skip
        return None if answered else line

    def write(self, data: bytes) -> None:
        """Bytes onto the harness's stdout, whole, one writer at a time."""
        with self._write_lock:
            view = memoryview(data)
            while view:
                view = view[os.write(self.wire_out, view) :]


_RUNNING: list[Front] = []
TERMINAL_HINT: Final = (
    "macula-mcp: this is the Macula mesh's MCP server; it speaks JSON-RPC on stdin for an agent "
    "harness. Add it to one with `macula-mcp register`; see two agents meet with `macula-mcp "
    "demo` (Ctrl-D ends this)"
)


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def start(env: Mapping[str, str]) -> Front:
    """The process's front, started on first call (stdin is read once). It takes the wire:
    fd 0 then reads the null device and fd 1 is stderr, so a stray print or a child process
    never touches the protocol (as the SDK's own stdio transport does)."""
    if not _RUNNING:
        if _isatty(0):  # a person, not a harness: say what this is (it still serves MCP)
            print(TERMINAL_HINT, file=sys.stderr, flush=True)
        wire_in, wire_out = os.dup(0), os.dup(1)  # not inherited by children
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            os.dup2(null, 0)
        finally:
            os.close(null)
        os.dup2(2, 1)
        _RUNNING.append(Front(env, wire_in, wire_out).start())
    return _RUNNING[0]


def running() -> Front | None:
    return _RUNNING[0] if _RUNNING else None
