"""``macula-mcp doctor``'s checks of first contact: this home's local station (running, stale),
and how the server answers a harness's opening probe (how fast, in which era).

Each check is ``(name, passed, detail)``; passed None is a warning (nothing fails, but a person
should know), and a detail that reports a problem names its fix."""

from __future__ import annotations

import json
import select
import subprocess
import time
from collections.abc import Mapping

from macula.config import (
    AGENT_ENV,
    IDENTITY_ENV,
    PREFIX,
    STATIONS_ENV,
    configured_stations,
    macula_home,
)
from macula.errors import ConfigError
from macula.stations import StationAddress, parse_station
from tools.launch import server_command
from tools.local_station.station import DEFAULT_STATION, local_station_status
from tools.server.runtime_gate import unresolved as no_station_resolves
from tools.settings import home_port, local_station_settings
from tools.stdio.front import CARD_FILE, UNSUPPORTED_PROTOCOL_VERSION, channel_on

Check = tuple[str, bool | None, str]
FIRST_ANSWER_GOAL_S = 1.0  # Claude Code's probe budget is about 2 s
ANSWER_TIMEOUT_S = 20.0
PROBE = {
    "jsonrpc": "2.0",
    "id": "doctor-probe",
    "method": "server/discover",
    "params": {
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "macula-doctor", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {},
        }
    },
}


async def configuration_check(env: Mapping[str, str]) -> tuple[Check, list[StationAddress]]:
    """Which stations this home's server uses, and the ones to probe: those of
    ``MACULA_MESH_STATIONS`` (checked as the server checks them), else this home's own station
    (its endpoint when it runs; ``DEFAULT_STATION`` is probed for one run by hand)."""
    name = "configuration"
    try:
        stations = configured_stations(env)
    except ConfigError as exc:
        return (name, False, str(exc)), []
    if stations:
        unresolved = await no_station_resolves(stations)
        if unresolved is not None:
            return (name, False, str(unresolved)), []
        return (name, True, f"{STATIONS_ENV}: {', '.join(map(str, stations))}"), stations
    status = local_station_status(macula_home(env))
    if status.state == "running" and status.endpoint:
        own = f"this home's own station {status.endpoint}"
    else:
        try:
            port: int | None = local_station_settings(env).port
        except ConfigError:  # said by the settings and local station checks
            port = None
        where = "any free port" if port == 0 else f"127.0.0.1:{port}" if port else "its port"
        own = f"this home's own station (none runs; the next session starts one on {where})"
    detail = f"{STATIONS_ENV} unset: {own}, or one run by hand at {DEFAULT_STATION}"
    return (name, True, detail), [parse_station(DEFAULT_STATION)]


def settings_checks(env: Mapping[str, str]) -> list[Check]:
    """Every ``MACULA_*`` setting the server reads, checked as it checks them at start-up: a
    bad one FAILs naming the variable (the server would answer every tool with it), and so
    does a contact policy that is not one (the server then refuses every ring: closed)."""
    from tools.server.runtime import preflight, startup_warnings

    checks: list[Check] = []
    without_stations = {k: v for k, v in env.items() if k != STATIONS_ENV}  # configuration's
    try:
        preflight(without_stations)
        checks.append(("settings", True, f"every {PREFIX}* value the server reads is valid"))
    except ConfigError as exc:
        said = str(exc).startswith((IDENTITY_ENV, AGENT_ENV, "identity"))  # the identity check's
        checks.append(("settings", False, str(exc)) if not said else ("settings", None, str(exc)))
    checks.extend(("contact policy", False, warning) for warning in startup_warnings(env))
    from tools.owner.approvals import approvals_check

    if (approvals := approvals_check(env)) is not None:
        checks.append(approvals)
    return checks


def owner_check(env: Mapping[str, str]) -> Check:
    """The owner's switches (``owner.toml``): absent is ``full``; malformed fails, naming the
    file, line and key (every switchable tool is off until it is fixed)."""
    from tools.owner.store import load, policy_path

    name = "owner switches"
    try:
        path = policy_path(macula_home(env))
    except ConfigError as exc:
        return name, False, str(exc)
    switches = load(path).switches(env.get(AGENT_ENV) or None)
    if switches.problem is not None:
        return (
            name,
            False,
            (
                f"{switches.problem.text()}: every switchable tool is off until it is fixed "
                "(edit the file; `macula-mcp owner show` names the problem)"
            ),
        )
    off = sorted(tool for tool, on in switches.on.items() if not on)
    if not off:
        return name, True, f"preset {switches.preset}: every tool on ({path})"
    return name, True, f"preset {switches.preset}: {len(off)} tools off ({path})"


def local_station_check(env: Mapping[str, str]) -> Check:
    home = macula_home(env)
    status = local_station_status(home)
    if status.state == "running":
        return "local station", True, f"pid {status.pid}, {status.endpoint}"
    if status.state == "stale":
        return (
            "local station",
            None,
            f"stale files ({status.detail}); the next session replaces them, or run "
            "`macula-mcp station stop` to remove them now",
        )
    try:
        port = local_station_settings(env).port
    except Exception as exc:  # a bad setting: named by the configuration check too
        return "local station", False, str(exc)
    chosen = "any free port" if port == 0 else f"127.0.0.1:{port}"
    if port == home_port(home):
        chosen += " (this home's own port)"
    return "local station", True, f"none runs; the next session starts one on {chosen}"


def first_answer_check(
    env: Mapping[str, str], command: list[str] | None = None, timeout_s: float = ANSWER_TIMEOUT_S
) -> Check:
    """Spawn the server as a harness does and time its answer to a 2026-07-28 probe."""
    argv = command or server_command()
    name = "first answer"
    started = time.perf_counter()
    try:
        child = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=dict(env),
        )  # fmt: skip
    except OSError as exc:
        return name, False, f"cannot start {argv[0]}: {exc}"
    assert child.stdin is not None and child.stdout is not None
    try:
        child.stdin.write(json.dumps(PROBE).encode() + b"\n")
        child.stdin.flush()
        ready, _, _ = select.select([child.stdout], [], [], timeout_s)
        line = child.stdout.readline() if ready else b""
        took = time.perf_counter() - started
    finally:
        child.stdin.close()
        _end(child, 5.0 if line else 0.5)
    try:
        answer = json.loads(line)
    except ValueError:
        return (
            name,
            False,
            (
                f"no answer to server/discover within {timeout_s:g} s (exit status "
                f"{child.returncode}); run `macula-mcp` by hand to see what it says on stderr"
            ),
        )
    return _judge(env, answer, took)


def _end(child: subprocess.Popen[bytes], grace_s: float) -> None:
    """Let ``child`` end by itself (its stdin is closed) for ``grace_s``, then ask it to
    (SIGTERM), then kill it: a server still dialling an unreachable station would otherwise
    hold the doctor for its whole connect budget."""
    for stop in (None, child.terminate):
        if stop is not None:
            stop()
        try:
            child.wait(grace_s)
            return
        except subprocess.TimeoutExpired:
            continue
    child.kill()
    child.wait()


def _judge(env: Mapping[str, str], answer: dict[str, object], took: float) -> Check:
    name = "first answer"
    error = answer.get("error")
    declined = isinstance(error, dict) and error.get("code") == UNSUPPORTED_PROTOCOL_VERSION
    result = answer.get("result")
    modern = isinstance(result, dict) and "2026-07-28" in (result.get("supportedVersions") or [])
    card = (macula_home(env) / CARD_FILE).exists()
    era = "declined 2026-07-28, so the client uses 2025-11-25" if declined else "2026-07-28"
    detail = f"{took:.2f} s to answer server/discover ({era}; handshake card {int(card)})"
    if channel_on(env) and modern:
        return (
            name,
            False,
            (
                f"{detail}: channel push is on but the 2026-07-28 era was offered, in which "
                "Claude Code drops claude/channel; update macula (the server should decline it)"
            ),
        )
    if not (declined or modern):
        return name, False, f"{detail}: unexpected answer {json.dumps(answer)[:200]}"
    if took > FIRST_ANSWER_GOAL_S:
        return (
            name,
            None,
            (
                f"{detail}: slower than {FIRST_ANSWER_GOAL_S:g} s (Claude Code gives up at about "
                "2 s and restarts the server in the other era); the machine is busy, or this "
                "is the first start after an update; `macula-mcp register --attach` starts faster"
            ),
        )
    return name, True, detail
