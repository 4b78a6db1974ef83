"""Every ``MACULA_*`` variable the library and the station read is named and parsed here.

Invariants:
- No other module of ``macula/`` or ``relay/`` writes a ``MACULA_`` name: they import the
  ``*_ENV`` names and the readers below (``tools/settings.py`` does the same for the MCP
  server's own variables; ``tests/unit/test_settings_shape.py`` checks both).
- ``MACULA_HOME`` is resolved here and nowhere else (``macula_home``): default ``~/.macula``,
  made absolute; set but empty, containing NUL, or naming a non-directory is a ``ConfigError``
  naming it. Stores, agents, the MCP server and the station CLI all ask this function.
- The default identity is chosen here and nowhere else (``identity_path``), so ``Node.from_env``
  and ``macula-mcp`` are the same agent for the same environment: ``MACULA_MCP_IDENTITY``, else
  ``MACULA_MCP_AGENT`` (``$MACULA_HOME/agents/<name>.key``), else one key per harness session
  (``$MACULA_HOME/sessions/<CLAUDE_CODE_SESSION_ID or ppid-N>.key``).
- Stations given without a node id are pinned on first use in ``$MACULA_HOME/known_stations``
  (``known_stations_from_env``; ``macula.known_stations``), for ``Node.from_env`` and
  ``macula-mcp`` alike.
- ``MACULA_MESH_STATIONS`` is read here (``configured_stations``): every entry is checked and a
  bad one is named; the order is the failover order (``macula.client.station_choice``).
- The readers (``text_setting``, ``flag_setting``, ``positive_int_setting``,
  ``choice_setting``, ``path_setting``) give a typed value or raise a ``ConfigError``.
- Every error is a ``ConfigError`` whose message starts with the variable at fault.
- The modules this one uses (``stations``, ``known_stations``, ``keyfile``...) never import it:
  they take a variable's name as an argument (``source``, ``pin_in``), so every other module
  can take names from here without an import cycle.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final, TypeVar

from macula.client.station_choice import station_list
from macula.errors import ConfigError
from macula.keyfile import KeyFileError, load_or_create_identity
from macula.known_stations import FILE_NAME as KNOWN_STATIONS_FILE
from macula.known_stations import KnownStations
from macula.stations import StationAddress, parse_station_list
from macula.wire.identity import Identity

PREFIX: Final = "MACULA_"  # every variable of ours starts so (a daemon forwards them)
MCP_PREFIX: Final = "MACULA_MCP_"  # the agent's and the MCP server's own variables
HOME_ENV: Final = "MACULA_HOME"
DEFAULT_HOME: Final = "~/.macula"
IDENTITY_ENV: Final = "MACULA_MCP_IDENTITY"
AGENT_ENV: Final = "MACULA_MCP_AGENT"
SESSION_ENV: Final = "CLAUDE_CODE_SESSION_ID"
STATIONS_ENV: Final = "MACULA_MESH_STATIONS"
LOOP_ENV: Final = "MACULA_LOOP"  # the event loop (macula.quic.event_loop)
QUIC_ENV: Final = "MACULA_QUIC"  # the QUIC library (macula.quic.backend)
# the agent's stores and settings (macula.store, macula.agent)
ROSTER_DB_ENV: Final = "MACULA_MCP_ROSTER_DB"
TRANSCRIPT_DB_ENV: Final = "MACULA_MCP_LOBBY_TRANSCRIPT_DB"
RINGS_DB_ENV: Final = "MACULA_MCP_RINGS_DB"
TASKS_DB_ENV: Final = "MACULA_MCP_TASKS_DB"
OWNER_FILE: Final = "owner.toml"  # the owner's policy in MACULA_HOME (issue 39)
TASKS_PREFIX: Final = "MACULA_MCP_TASKS_"  # + a TaskLimits field in capitals
CONTACT_POLICY_ENV: Final = "MACULA_MCP_CONTACT_POLICY"
CONTACT_POLICY_FILE_ENV: Final = "MACULA_MCP_CONTACT_POLICY_FILE"
NO_RING_ENV: Final = "MACULA_MCP_NO_RING"
NO_CITIZENSHIP_ENV: Final = "MACULA_MCP_NO_CITIZENSHIP"
OPERATOR_NAME_ENV: Final = "MACULA_MCP_OPERATOR_NAME"
HELLO_MESSAGE_ENV: Final = "MACULA_MCP_HELLO_MESSAGE"
MODEL_ENV: Final = "MACULA_MCP_MODEL"
# the audit trail (macula.agent.audit): 1 turns it off; segment size in KiB, segments kept
NO_AUDIT_ENV: Final = "MACULA_MCP_NO_AUDIT"
AUDIT_SEGMENT_KB_ENV: Final = "MACULA_MCP_AUDIT_SEGMENT_KB"
AUDIT_SEGMENTS_ENV: Final = "MACULA_MCP_AUDIT_SEGMENTS"

C = TypeVar("C", bound=ConfigError)


def _environ(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def task_limit_env(field: str) -> str:
    """The variable of one ``TaskLimits`` field: ``MACULA_MCP_TASKS_<FIELD>``."""
    return f"{TASKS_PREFIX}{field.upper()}"


def bounds_env(store: str, what: str) -> str:
    """A store's bound: ``MACULA_MCP_<STORE>_<WHAT>`` (``MAX_ROWS``, ``MAX_AGE_DAYS``)."""
    return f"{MCP_PREFIX}{store}_{what}"


def text_setting(env: Mapping[str, str], name: str) -> str | None:
    """The value of ``name`` as given; None when unset or empty."""
    return env.get(name) or None


def flag_setting(env: Mapping[str, str], name: str) -> bool:
    """``name`` as 0 or 1 (unset or blank: 0); anything else is an error naming it."""
    raw = env.get(name, "0").strip()
    if raw not in ("", "0", "1"):
        raise ConfigError(f"{name} must be 0 or 1, not {raw!r}")
    return raw == "1"


def positive_int_setting(env: Mapping[str, str], name: str, default: int) -> int:
    """``name`` as a whole number >= 1; ``default`` when unset."""
    raw = env.get(name)
    if raw is None:
        return default
    text = raw.strip()
    if not text.isdecimal() or int(text) < 1:
        raise ConfigError(f"{name} must be a positive integer, not {raw!r}")
    return int(text)


def choice_setting(
    env: Mapping[str, str], name: str, choices: tuple[str, ...], error: type[C]
) -> str:
    """``name`` lowered, one of ``choices`` (unset or blank: the first); else ``error``."""
    value = env.get(name, "").strip().lower() or choices[0]
    if value not in choices:
        raise error(f"{name}={value!r} is not one of {', '.join(choices)}")
    return value


def expand_path(raw: str, name: str) -> Path:
    """``raw`` with ``~`` expanded, made absolute (a later ``chdir`` does not move it)."""
    try:
        return Path(raw).expanduser().absolute()
    except RuntimeError as exc:  # "~" with no home directory to expand it to
        raise ConfigError(f"{name}: cannot expand {raw!r}: {exc}") from None


def path_setting(env: Mapping[str, str], name: str, what: str) -> Path | None:
    """The path in variable ``name``, or None when unset; set but empty is an error."""
    raw = env.get(name)
    if raw is None:
        return None
    if not raw.strip():
        raise ConfigError(f"{name} is set but empty: give {what} or unset it")
    if "\x00" in raw:
        raise ConfigError(f"{name}: the path contains a NUL character")
    return expand_path(raw, name)


def macula_home(env: Mapping[str, str] | None = None) -> Path:
    """The folder macula keeps its files in (see the module docstring)."""
    environ = _environ(env)
    home = path_setting(environ, HOME_ENV, "a directory") or expand_path(DEFAULT_HOME, HOME_ENV)
    if home.exists() and not home.is_dir():
        raise ConfigError(f"{HOME_ENV}: {home} exists and is not a directory")
    return home


def identity_path(env: Mapping[str, str] | None = None) -> Path:
    """Which key file this process is (see the module docstring)."""
    environ = _environ(env)
    explicit = path_setting(environ, IDENTITY_ENV, "the path of a key file")
    if explicit is not None:
        return explicit
    home = macula_home(environ)
    if name := environ.get(AGENT_ENV):
        if not name.replace("-", "").replace("_", "").isalnum() or len(name) > 64:
            raise ConfigError(f"{AGENT_ENV} must be 1-64 letters, digits, '-' or '_'")
        return home / "agents" / f"{name}.key"
    scope = environ.get(SESSION_ENV) or f"ppid-{os.getppid()}"
    safe = "".join(c for c in scope if c.isalnum() or c in "-_")[:64] or "default"
    return home / "sessions" / f"{safe}.key"


def identity_from_env(env: Mapping[str, str] | None = None) -> Identity:
    """The identity at ``identity_path``, created puzzle-hardened if missing."""
    environ = _environ(env)
    path = identity_path(environ)
    try:
        return load_or_create_identity(path)
    except (KeyFileError, OSError) as exc:
        source = (
            IDENTITY_ENV
            if environ.get(IDENTITY_ENV)
            else AGENT_ENV
            if environ.get(AGENT_ENV)
            else "identity"
        )
        raise ConfigError(f"{source}: {exc}") from None


def configured_stations(env: Mapping[str, str] | None = None) -> list[StationAddress]:
    """The stations of ``MACULA_MESH_STATIONS`` in order (a node fails over along them), every
    entry checked: a malformed, empty or repeated entry is a ``ConfigError`` naming it. Unset
    or blank gives an empty list."""
    stations = parse_station_list(_environ(env).get(STATIONS_ENV, ""), source=STATIONS_ENV)
    return station_list(stations, source=STATIONS_ENV) if stations else []


def mesh_stations_from_env(env: Mapping[str, str] | None = None) -> list[StationAddress]:
    """The stations of ``MACULA_MESH_STATIONS``; empty is an error (a node needs one)."""
    stations = configured_stations(env)
    if not stations:
        raise ConfigError(f"{STATIONS_ENV} is empty: set it to host:port or node_id@host:port")
    return stations


def known_stations_from_env(env: Mapping[str, str] | None = None) -> KnownStations:
    """The known-stations file of this ``MACULA_HOME`` (pins of stations given as host:port)."""
    return KnownStations(macula_home(_environ(env)) / KNOWN_STATIONS_FILE, pin_in=STATIONS_ENV)
