"""This ``MACULA_HOME``'s local station: its own process, on its own port, pinned to its key.

``macula-mcp`` without ``MACULA_MESH_STATIONS`` uses a station of this home: a station run by
hand at ``DEFAULT_STATION`` (``127.0.0.1:4433``) whose key is this home's, else the local
station process, started when none runs. Anybody on the machine can bind a port first, so
what answers is dialled pinned to a key this ``MACULA_HOME`` knows: the public part of
``$MACULA_HOME/embedded-station/station.key`` (the local station's) or
``$MACULA_HOME/station/station.key`` (``macula-relay``'s default data dir).

Invariants:
- a station answering at ``DEFAULT_STATION`` with one of those keys is returned pinned
  (``node_id@127.0.0.1:4433``), so a later reconnect refuses an impostor too;
- one answering there with another key (another home's station, another user's) is never
  used, and never stops this home: ``own_default_station`` says ``ForeignStationError`` (for
  ``doctor``), ``default_station`` says so on stderr and starts this home's own station;
- each home's local station listens on a port of its own: ``home_port`` (a stable port
  derived from the home's path, 20000-29999), or a free one when that is taken, recorded in
  ``station.endpoint``; ``MACULA_MCP_LOCAL_STATION_PORT`` sets it (0 = any free port).

The local station (``default_station``) is a background process of its own, not part of the
session that started it: ``python -m relay.ops.cli`` on the embedded data dir, in a new session,
logging to ``$MACULA_HOME/logs/station.log`` (rotated; fatal output in ``station.out``).

- one start at a time: ``station.lock`` (fcntl) in the data dir is held from the check until
  the station listens (or until stopping is done), so two sessions starting at once start one;
- the station writes ``station.pid`` and ``station.endpoint`` (``node_id@127.0.0.1:port``)
  0600 in the 0700 data dir once it listens and removes them on a clean exit;
- it is reused only when its pid is alive, is our station (its command line names our data
  dir, where the OS tells) and it answers a handshake with the recorded key, which is this
  data dir's key; the client dials it pinned to that key;
- files left by a crash, corrupt ones, or a pid now held by another program are stale: said
  on stderr and replaced; a process of ours that does not answer is never killed silently;
- it ends by itself (``relay.ops.lifetime``) when its data dir is gone (the home was deleted) or
  after ``MACULA_MCP_LOCAL_STATION_IDLE_S`` (default 6 h) with no connection open;
- a station that does not listen within ``MACULA_MCP_LOCAL_STATION_TIMEOUT_S`` is stopped and
  ``LocalStationError`` names its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from macula.config import HOME_ENV, STATIONS_ENV, macula_home
from macula.errors import HandshakeError, MaculaError
from macula.known_stations import STATION_KEY_FILE, station_node_id
from macula.quic.transport import client_configuration, dial
from macula.stations import StationAddress, parse_station
from tools.local_station.process import relay_command, relay_environment
from tools.settings import (
    LOCAL_STATION_IDLE_ENV,
    LOCAL_STATION_TIMEOUT_ENV,
    LocalStationSettings,
    local_station_settings,
)

DEFAULT_STATION: Final = "127.0.0.1:4433"
EMBEDDED_DIR: Final = "embedded-station"  # the embedded station's data dir under MACULA_HOME
RELAY_DIR: Final = "station"  # macula-relay's default data dir under MACULA_HOME
PROBE_TIMEOUT_S: Final = 1.0


class ForeignStationError(HandshakeError):
    """The station at the default address is not this user's (message says what to do)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


def own_station_keys(env: Mapping[str, str]) -> dict[bytes, Path]:
    """node id -> data dir, for each station key this ``MACULA_HOME`` holds."""
    home = macula_home(env)
    keys: dict[bytes, Path] = {}
    for data_dir in (home / EMBEDDED_DIR, home / RELAY_DIR):
        node_id = station_node_id(data_dir)
        if node_id is not None:
            keys.setdefault(node_id, data_dir)
    return keys


async def presented_key(address: StationAddress, timeout: float = PROBE_TIMEOUT_S) -> bytes | None:
    """The certificate key of whatever completes a QUIC handshake at ``address`` (``b""``
    when it shows no Ed25519 key), or None when nothing does."""
    try:
        async with dial(
            address.host, address.port, client_configuration(server_name=address.host),
            timeout=timeout,
        ) as protocol:  # fmt: skip
            return protocol.peer_certificate_key() or b""
    except (OSError, TimeoutError, ConnectionError):
        return None


def foreign_station(
    address: StationAddress, presented: bytes, expected: Mapping[bytes, Path], home: Path
) -> ForeignStationError:
    shown = presented.hex() if presented else "no Ed25519 key"
    use = f"set {STATIONS_ENV}={presented.hex()}@{address}" if presented else f"set {STATIONS_ENV}"
    if expected:
        ours = " or ".join(
            f"{key.hex()} (from {data_dir / STATION_KEY_FILE})"
            for key, data_dir in expected.items()
        )
        return ForeignStationError(
            f"the station at {address} presented key {shown}, expected {ours}: another "
            f"program, perhaps another home's or user's station, holds the port. macula-mcp "
            f"uses this home's own local station instead; if you trust that one, {use}"
        )
    return ForeignStationError(
        f"the station at {address} presented key {shown}, and this {HOME_ENV} ({home}) has no "
        f"station key to check it against ({home / EMBEDDED_DIR / STATION_KEY_FILE} or "
        f"{home / RELAY_DIR / STATION_KEY_FILE}): it may be another home's or user's. "
        f"macula-mcp uses this home's own local station instead; if you trust that one, {use}"
    )


async def own_default_station(
    env: Mapping[str, str], port: int | None = None
) -> StationAddress | None:
    """The default station (on ``port`` if given) pinned to its key when it is this home's;
    None when nothing answers; ``ForeignStationError`` when something else does."""
    default = parse_station(DEFAULT_STATION)
    if port is not None:
        default = StationAddress(default.host, port)
    presented = await presented_key(default)
    if presented is None:
        return None
    expected = own_station_keys(env)
    if presented in expected:
        return StationAddress(default.host, default.port, presented)
    raise foreign_station(default, presented, expected, macula_home(env))


# ---- the local station as a background process ------------------------------------------

LOG_BACKUPS: Final = 3
STOP_TIMEOUT_S: Final = 8.0  # the station drains within 5 s (relay.ops.cli)
VERIFY_TIMEOUT_S: Final = 3.0
POLL_S: Final = 0.05  # how often a start or stop looks at the files and the process
_STARTED: dict[int, subprocess.Popen[bytes]] = {}  # stations this process started, to reap


class LocalStationError(MaculaError):
    """The local station cannot be started, reused or stopped (the message says why and what
    to do, naming its log)."""


@dataclass(frozen=True)
class StationFiles:
    """Where the local station of one ``MACULA_HOME`` keeps its key, process files and logs."""

    home: Path

    @property
    def data_dir(self) -> Path:
        return self.home / EMBEDDED_DIR

    @property
    def pid(self) -> Path:
        return self.data_dir / "station.pid"

    @property
    def endpoint(self) -> Path:
        return self.data_dir / "station.endpoint"

    @property
    def lock(self) -> Path:
        return self.data_dir / "station.lock"

    @property
    def log(self) -> Path:
        return self.home / "logs" / "station.log"

    @property
    def out(self) -> Path:
        return self.home / "logs" / "station.out"


@dataclass(frozen=True)
class LocalStationStatus:
    """What ``station status`` shows. ``state``: running, stopped, or stale (files left behind:
    a crash, a corrupt file, or a pid that is not our station)."""

    state: str
    files: StationFiles
    pid: int | None = None
    endpoint: str | None = None
    uptime_s: float | None = None
    detail: str = ""

    def view(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "pid": self.pid,
            "endpoint": self.endpoint,
            "uptime_s": None if self.uptime_s is None else round(self.uptime_s, 1),
            "data_dir": str(self.files.data_dir),
            "log": str(self.files.log),
            "detail": self.detail,
        }


def _private_dir(path: Path) -> None:
    if not path.is_dir():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask


def _read_small(path: Path) -> str | None:
    try:
        with path.open("rb") as handle:
            return handle.read(512).decode("ascii").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        return f"\0{exc}"  # unreadable: reported as corrupt


def _recorded(files: StationFiles) -> tuple[int, StationAddress, float] | str | None:
    """(pid, endpoint, started at) from the files; None when there are none; a sentence saying
    what is wrong when they are partial or corrupt."""
    pid_text, endpoint_text = _read_small(files.pid), _read_small(files.endpoint)
    if pid_text is None and endpoint_text is None:
        return None
    if pid_text is None or endpoint_text is None:
        missing = files.pid if pid_text is None else files.endpoint
        return f"{missing} is missing"
    if not pid_text.isdigit() or int(pid_text) <= 1:
        return f"{files.pid} does not hold a process id ({pid_text[:40]!r})"
    try:
        address = parse_station(endpoint_text, source=str(files.endpoint))
    except ValueError as exc:
        return f"{files.endpoint} does not hold node_id@host:port: {exc}"
    if address.node_id is None:
        return f"{files.endpoint} names no node id ({endpoint_text[:80]!r})"
    try:
        started = files.pid.stat().st_mtime
    except OSError:
        started = time.time()
    return int(pid_text), address, started


def _command_line(pid: int) -> list[str] | None:
    """The process's arguments, [] for a zombie, None when the OS does not say."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        return [part.decode(errors="replace") for part in raw.split(b"\0") if part]
    except FileNotFoundError:
        if Path("/proc/self/cmdline").exists():
            return []  # gone meanwhile
    except OSError:
        return None
    try:
        shown = subprocess.run(
            ["ps", "-o", "command=", "-p", str(pid)], capture_output=True, timeout=2, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return shown.stdout.decode(errors="replace").split() if shown.returncode == 0 else []


def _ours(pid: int, files: StationFiles) -> bool | None:
    """Is ``pid`` a live station on our data dir? None: alive, the OS does not say what."""
    child = _STARTED.get(pid)
    if child is not None and child.poll() is not None:
        del _STARTED[pid]
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process
    arguments = _command_line(pid)
    if arguments is None:
        return None
    return str(files.data_dir) in arguments and "relay.ops.cli" in " ".join(arguments)


def _exited(pid: int) -> bool:
    """No such process, or only its exit status is left (a zombie): a process on its way out
    has an empty command line a moment before that, while it still runs its exit."""
    child = _STARTED.get(pid)
    if child is not None and child.poll() is not None:
        del _STARTED[pid]
        return True
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc to ask, or gone meanwhile: the signal check above is all we have
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def local_station_status(home: Path) -> LocalStationStatus:
    """The local station of ``home`` as its files and the OS tell (no network)."""
    files = StationFiles(home)
    recorded = _recorded(files)
    if recorded is None:
        return LocalStationStatus("stopped", files, detail="no local station runs")
    if isinstance(recorded, str):
        return LocalStationStatus("stale", files, detail=recorded)
    pid, address, started = recorded
    if _ours(pid, files) is False:
        detail = f"pid {pid} (from {files.pid}) is not a running station of this {HOME_ENV}"
        return LocalStationStatus("stale", files, pid, str(address), detail=detail)
    uptime = max(0.0, time.time() - started)
    return LocalStationStatus("running", files, pid, str(address), uptime, "")


def _lock_file(files: StationFiles) -> int:
    _private_dir(files.home)
    _private_dir(files.data_dir)
    fd = os.open(files.lock, os.O_RDWR | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def _took_lock(fd: int, files: StationFiles, deadline: float, timeout_s: float) -> bool:
    """Locked now: True; held by another: False until ``deadline``, then LocalStationError."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        if time.monotonic() < deadline:
            return False
    raise LocalStationError(
        f"{files.lock} stayed locked for {timeout_s:.0f} s: another process is starting or "
        "stopping the local station; try again"
    )


@contextlib.contextmanager
def _locked(files: StationFiles, timeout_s: float) -> Iterator[None]:
    fd = _lock_file(files)
    try:
        deadline = time.monotonic() + timeout_s
        while not _took_lock(fd, files, deadline, timeout_s):
            time.sleep(POLL_S)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.asynccontextmanager
async def _locked_async(files: StationFiles, timeout_s: float) -> AsyncIterator[None]:
    fd = _lock_file(files)
    try:
        deadline = time.monotonic() + timeout_s
        while not _took_lock(fd, files, deadline, timeout_s):
            await asyncio.sleep(POLL_S)
        yield
    finally:
        os.close(fd)  # releases the lock


def _remove_stale(files: StationFiles) -> None:
    for path in (files.pid, files.endpoint):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def stop_local_station(home: Path, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """Stop the local station of ``home``: SIGTERM, then wait while it says goodbye to its
    clients. True when one was running; stale files are removed either way.
    ``LocalStationError`` when it does not exit in time (it is not killed)."""
    files = StationFiles(home)
    if not files.data_dir.is_dir():
        return False
    with _locked(files, timeout_s):
        status = local_station_status(home)
        if status.state != "running" or status.pid is None:
            _remove_stale(files)
            return False
        pid = status.pid
        if _ours(pid, files) is None:
            raise LocalStationError(
                f"cannot tell whether pid {pid} (from {files.pid}) is the local station; "
                "stop it yourself if it is"
            )
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _ours(pid, files) is not False or not _exited(pid):
            if time.monotonic() >= deadline:
                raise LocalStationError(
                    f"the local station (pid {pid}) did not stop within {timeout_s:.0f} s; see "
                    f"{files.log}; to end it at once: kill -9 {pid}"
                )
            time.sleep(POLL_S)
        _remove_stale(files)  # a clean exit removed them already; a killed one did not
        return True


def _say(text: str) -> None:
    print(f"macula-mcp: {text}", file=sys.stderr, flush=True)


async def _answering(files: StationFiles, say: Callable[[str], None]) -> StationAddress | None:
    """The running local station, verified; None (stale files removed) when there is none."""
    recorded = _recorded(files)
    if recorded is None:
        return None
    if isinstance(recorded, str):
        say(f"the local station's files are stale ({recorded}); replacing them")
        _remove_stale(files)
        return None
    pid, address, _ = recorded
    ours = _ours(pid, files)
    if ours is False:
        say(f"the local station (pid {pid}) is not running; starting a new one")
        _remove_stale(files)
        return None
    own_key = station_node_id(files.data_dir)
    presented = await presented_key(address, timeout=VERIFY_TIMEOUT_S)
    if presented is not None and presented == address.node_id == own_key:
        return address
    if ours is None:  # the OS does not say what pid is: a program that is not our station
        say(f"pid {pid} in {files.pid} is not our station; starting a new one")
        _remove_stale(files)
        return None
    shown = "nothing" if presented is None else (presented.hex() or "no Ed25519 key")
    raise LocalStationError(
        f"the local station (pid {pid}) runs but {address} answered with {shown}, expected "
        f"{own_key.hex() if own_key else 'its key'}; see {files.log}; stop it with "
        "`macula-mcp station stop` and start again"
    )


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _spawn(files: StationFiles, port: int, config: LocalStationSettings) -> subprocess.Popen[bytes]:
    _private_dir(files.log.parent)
    command = relay_command(
        "--host", "127.0.0.1", "--port", str(port),
        "--data-dir", str(files.data_dir), "--endpoint-file", str(files.endpoint),
        "--pid-file", str(files.pid), "--log-file", str(files.log),
        "--log-max-bytes", str(config.log_bytes), "--log-backups", str(LOG_BACKUPS),
        "--exit-when-gone", str(files.data_dir), "--idle-exit-s", repr(config.idle_s),
        "--lifetime-check-s", repr(config.check_s),
    )  # fmt: skip
    env = relay_environment(os.environ)
    out = os.open(files.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        child = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=files.home, env=env,
            start_new_session=True, umask=0o077,
        )  # fmt: skip
    finally:
        os.close(out)
    _STARTED[child.pid] = child
    return child


def _last_words(files: StationFiles) -> str:
    try:
        text = files.out.read_bytes()[-400:].decode(errors="replace").strip()
    except OSError:
        text = ""
    last = text.splitlines()[-1] if text else ""
    return f": {last}" if last else ""


async def _start(files: StationFiles, port: int, config: LocalStationSettings) -> str:
    _remove_stale(files)
    child = _spawn(files, port, config)
    deadline = time.monotonic() + config.timeout_s
    while True:
        code = child.poll()
        if code is not None:
            _STARTED.pop(child.pid, None)
            raise LocalStationError(
                f"the local station exited with status {code} before listening"
                f"{_last_words(files)} (see {files.out} and {files.log})"
            )
        recorded = _recorded(files)
        if not isinstance(recorded, str) and recorded is not None and recorded[0] == child.pid:
            return str(recorded[1])
        if time.monotonic() >= deadline:
            child.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(child.wait, STOP_TIMEOUT_S)
            if child.poll() is None:
                child.kill()
            _STARTED.pop(child.pid, None)
            raise LocalStationError(
                f"the local station did not listen within {config.timeout_s:g} s "
                f"({LOCAL_STATION_TIMEOUT_ENV}); see {files.log} and {files.out}"
            )
        await asyncio.sleep(POLL_S)


async def default_station(
    env: Mapping[str, str], say: Callable[[str], None] = _say
) -> tuple[StationAddress, str | None]:
    """The station a ``macula-mcp`` with no configured station uses, pinned, and the endpoint
    of the local station process when it is that one (None: a station run by hand on the
    default address with this home's key). Starts the local station when none runs; another
    home's station anywhere never stops this."""
    config = local_station_settings(env)
    files = StationFiles(macula_home(env))
    async with _locked_async(files, config.timeout_s + VERIFY_TIMEOUT_S + 5):
        running = await _answering(files, say)
        if running is not None:
            return running, str(running)
        by_hand = await _own_station_by_hand(env, say)
        if by_hand is not None:
            return by_hand, None
        port = config.port
        if port and _port_taken(port):
            say(f"127.0.0.1:{port} is in use by another program; this home's local station "
                "listens on a free port instead")  # fmt: skip
            port = 0
        endpoint = await _start(files, port, config)
        say(f"started the local station {endpoint} (log {files.log}); it keeps serving after "
            f"this session ends, until its home is removed or it is idle for {config.idle_s:g} s "
            f"({LOCAL_STATION_IDLE_ENV}); `macula-mcp station stop` stops it")  # fmt: skip
        return parse_station(endpoint), endpoint


async def _own_station_by_hand(
    env: Mapping[str, str], say: Callable[[str], None]
) -> StationAddress | None:
    """A station of this home answering at ``DEFAULT_STATION`` (``macula-relay`` run by hand),
    pinned; None when the port is free or holds something else (said, not fatal)."""
    default = parse_station(DEFAULT_STATION)
    if not _port_taken(default.port):  # a free port needs no probe: nothing answers there
        return None
    try:
        return await own_default_station(env)
    except MaculaError as exc:  # another's key, or this home's key files unreadable
        say(f"not using {DEFAULT_STATION}: {exc}")
        return None
