"""RPC tools: ``mesh_call``, and ``mesh_serve`` / ``mesh_unserve`` (a local command per call).

Invariants of serving (a standing inbound trigger any mesh caller can invoke):
- the caller's payload reaches the command as JSON (bytes as hex) on its stdin and nowhere
  else: ``exec`` is split once with ``shlex`` when it is registered and run without a shell, so
  nothing a caller sends can become part of a command line. The environment is minimal
  (``tools.groups.serve_gate.command_env``): PATH, HOME, LANG, TMPDIR of this server, plus
  ``MACULA_CALLER`` (the caller's node id), ``MACULA_PROCEDURE`` and ``MACULA_REALM`` (hex);
  no other variable of the harness (API keys live there) reaches the command;
- before a command runs, ``tools.groups.serve_gate.ServeGate`` admits the caller: on the contact
  allowlist when ``allow="allowlist"``, and within ``rate_per_minute`` (per caller and
  procedure); a refusal is an error reply to that caller saying what to do, counted; with
  ``allow="owner"`` each admitted call waits for the owner's approval and runs once approved
  (``tools.groups.owner.served_calls`` states what the caller sees);
- each call runs in a process group of its own (``start_new_session``); when the call ends —
  reply, failure, timeout or cancellation — the whole group is killed, so no child outlives it;
- stdout is read up to ``MAX_STDOUT`` and must be one JSON value (the reply); stderr is kept
  (last ``MAX_STDERR`` bytes) for the local log only and never leaves this machine;
- a non-zero exit, a timeout, oversized or non-JSON stdout raise ``CommandFailed`` in the
  handler: the Node answers that caller with ERROR 0x0F and a short reason; no other call or
  procedure is affected. At most ``MAX_RUNNING`` commands run at once per procedure.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import os
import shlex
import shutil
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from macula.agent.audit import NO_TRAIL, Recorder
from macula.clock import now_ms
from macula.errors import MaculaError
from macula.node.serving import CallRefused, IncomingCall
from tools.groups.owner.served_calls import HeldCalls, Runner
from tools.groups.realm_access import ADVERTISE_REFUSALS, acting, check
from tools.groups.realms import parse_realm
from tools.groups.serve_gate import (
    ALLOW_MODES,
    DEFAULT_RATE_PER_MINUTE,
    MAX_RATE_PER_MINUTE,
    ServeGate,
    command_env,
)
from tools.groups.text_limits import (
    MAX_EXEC,
    MAX_IDEMPOTENCY_KEY,
    MAX_PROCEDURE,
    IdempotencyKey,
    Realm,
)
from tools.groups.value_limits import too_deep
from tools.server.context import Descriptions, hints, register_tools, runtime_of
from tools.server.results import InvalidArgument, bad_argument, plain
from tools.server.runtime import Runtime, run_tool

log = logging.getLogger("macula.tools")

DEFAULT_CALL_TIMEOUT_MS = 5000
MAX_CALL_TIMEOUT_MS = 600_000
DEFAULT_EXEC_TIMEOUT_S = 10.0
MIN_EXEC_TIMEOUT_S = 0.1
MAX_EXEC_TIMEOUT_S = 60.0
MAX_STDOUT = 1024 * 1024
MAX_STDERR = 64 * 1024
MAX_RUNNING = 8  # concurrent executions per served procedure; more are refused as "busy"
ANNOUNCE_TIMEOUT_S = 10.0
RESERVED_PREFIXES = ("_", "agent.")  # station built-ins; the agent layer's ring endpoints
_READ = 64 * 1024
_PROCESS = os.urandom(4).hex()  # what mesh_serve did ends with this process: so do its receipts


class CommandFailed(CallRefused):
    """A served command produced no reply; the message (short, no stderr) goes to the caller."""


# -- running one command --------------------------------------------------------------------


def kill_group(pgid: int) -> None:
    """SIGKILL every process of the group ``pgid`` (gone already is fine)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def _feed(pipe: asyncio.StreamWriter | None, data: bytes) -> None:
    if pipe is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.write(data)
        await pipe.drain()
    pipe.close()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        await pipe.wait_closed()


async def _read_capped(
    stream: asyncio.StreamReader | None, limit: int, overflow: Callable[[], None]
) -> bytes | None:
    """Everything up to ``limit`` bytes, or None (after calling ``overflow``) beyond it."""
    if stream is None:
        return b""
    data = bytearray()
    while chunk := await stream.read(_READ):
        if len(data) + len(chunk) > limit:
            overflow()
            return None
        data += chunk
    return bytes(data)


async def _read_tail(stream: asyncio.StreamReader | None, limit: int) -> bytes:
    """Drain ``stream`` (so the command never blocks on a full pipe), keeping its last bytes."""
    tail = bytearray()
    while stream is not None and (chunk := await stream.read(_READ)):
        tail += chunk
        del tail[:-limit]
    return bytes(tail)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_reply(stdout: bytes) -> Any:
    try:
        return json.loads(stdout, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise CommandFailed(f"the command's stdout is not one JSON value ({exc})") from None


async def run_command(
    argv: Sequence[str], stdin: bytes, *, timeout: float, env: Mapping[str, str]
) -> tuple[Any, bytes]:
    """Run ``argv`` (no shell) with ``stdin``; ``(reply, stderr tail)`` or ``CommandFailed``."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        env=dict(env),
    )
    try:
        async with asyncio.timeout(timeout):
            stdout, stderr, _ = await asyncio.gather(
                _read_capped(proc.stdout, MAX_STDOUT, lambda: kill_group(proc.pid)),
                _read_tail(proc.stderr, MAX_STDERR),
                _feed(proc.stdin, stdin),
            )
            status = await proc.wait()
    except TimeoutError:
        raise CommandFailed(f"timed out after {timeout:g} s; the command was killed") from None
    finally:
        kill_group(proc.pid)  # stragglers of a finished command too
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                await proc.wait()
    if stdout is None:
        raise CommandFailed(f"the command wrote more than {MAX_STDOUT} bytes to stdout")
    if status != 0:
        how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
        raise CommandFailed(f"the command {how}")
    return parse_reply(stdout), stderr


def _handler(
    name: str,
    argv: list[str],
    timeout: float,
    entry: dict[str, Any],
    gate: ServeGate,
    held: HeldCalls | None = None,
    audit: Recorder = NO_TRAIL,
) -> Callable[[IncomingCall], Any]:
    """The Node's handler for ``name``: one run of ``argv`` per admitted call, counted in
    ``entry``; with ``held`` (``allow="owner"``) the call waits for the owner instead, and
    ``entry["run"]`` runs it once approved. Each call is in the agent's trail
    (``call_received``: accepted, refused or queued, the payload as a digest)."""

    def audited(caller: bytes, payload: Any, outcome: str, **code: str) -> None:
        audit.record("call_received", outcome, procedure=name, caller=caller.hex(),
                     content_digest=audit.digest(payload), **code)  # fmt: skip

    async def run(procedure: str, caller: bytes, realm: bytes, payload: Any) -> Any:
        if entry["running"] >= MAX_RUNNING:
            entry["errors"] += 1
            audited(caller, payload, "refused", code="busy")
            raise CommandFailed(f"busy: {MAX_RUNNING} calls of {name} already running; retry")
        audited(caller, payload, "accepted")
        env = command_env(os.environ, caller, name, realm)
        stdin = json.dumps(payload, ensure_ascii=False).encode()
        entry["running"] += 1
        try:
            reply, stderr = await run_command(argv, stdin, timeout=timeout, env=env)
        except (CommandFailed, OSError) as exc:
            entry["errors"] += 1
            entry["last_error"] = str(exc)
            log.warning("served %s failed for caller %s: %s", name, caller.hex()[:16], exc)
            if isinstance(exc, OSError):
                raise CommandFailed("the command could not be started") from None
            raise
        finally:
            entry["running"] -= 1
        if stderr:
            log.info("served %s stderr: %s", name, stderr[-2000:].decode("utf-8", "replace"))
        return reply

    async def handle(call: IncomingCall) -> Any:
        entry["calls"] += 1
        payload = plain(call.payload)
        refusal = gate.check(call.caller)
        if refusal is not None:
            counter, reason = refusal
            entry[counter] += 1
            audited(call.caller, payload, "refused", code=counter)
            raise CommandFailed(reason)
        if held is not None and held.holds(gate.allow):
            audited(call.caller, payload, "queued")
            return await held.handle(name, call, payload)
        return await run(name, call.caller, call.realm, payload)

    entry["run"] = run
    return handle


# -- argument checks ------------------------------------------------------------------------


def procedure_problem(name: str, *, serving: bool) -> str | None:
    """What is wrong with procedure ``name`` (its length bound: the signature's ``Field``)."""
    if not name:
        return f"must be 1-{MAX_PROCEDURE} characters"
    if any(c.isspace() or not c.isprintable() for c in name):
        return "must not contain whitespace or control characters"
    if serving and name.startswith(RESERVED_PREFIXES):
        return "names starting with '_' (station built-ins) or 'agent.' (rings) are reserved"
    return None


def parse_exec(command: str) -> list[str] | CallToolResult:
    if not command.strip():  # its length bound: mesh_serve's signature
        return bad_argument("exec", f"must be a command line of 1-{MAX_EXEC} characters")
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        return bad_argument("exec", f"cannot be split like a shell would ({exc})")
    program = shutil.which(argv[0])
    if program is None:
        return bad_argument("exec", f"{argv[0]!r} is not an executable (nor found on PATH)")
    return [program, *argv[1:]]


def process_scoped(key: str | None) -> str | None:
    """A receipt of mesh_serve is valid only in the process that served: after a restart the
    same key serves again instead of replaying a registration that no longer exists."""
    if key is None:
        return None
    room = MAX_IDEMPOTENCY_KEY - len(_PROCESS) - 1
    if len(key) > room:
        key = key[: room - 13] + "~" + hashlib.sha256(key.encode()).hexdigest()[:12]
    return f"{key}@{_PROCESS}"


# -- tools ----------------------------------------------------------------------------------


async def mesh_call(
    ctx: Context,
    procedure: Annotated[str, Field(max_length=MAX_PROCEDURE, description="e.g. io.macula.echo")],
    args: Annotated[Any, Field(description="any JSON value (no booleans)")] = None,
    realm: Realm = None,
    timeout_ms: Annotated[int, Field(ge=1, le=MAX_CALL_TIMEOUT_MS)] = DEFAULT_CALL_TIMEOUT_MS,
    direct: Annotated[int, Field(ge=0, le=1, description="1: dial the station the DHT names")] = 0,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    tag = parse_realm(realm)
    if isinstance(tag, CallToolResult):
        return tag
    if problem := procedure_problem(procedure, serving=False):
        return bad_argument("procedure", problem)
    if deep := too_deep("args", args):
        return deep

    async def work() -> dict[str, Any]:
        started = time.monotonic()
        result = await runtime.node.call(
            tag, procedure, args, timeout=timeout_ms / 1000, direct=direct == 1
        )
        elapsed = round((time.monotonic() - started) * 1000, 1)
        return {"procedure": procedure, "realm": tag.hex(), "result": result,
                "duration_ms": elapsed, "direct": direct}  # fmt: skip

    request = {"procedure": procedure, "args": args, "realm": tag.hex(), "direct": direct}
    return await run_tool(runtime, "mesh_call", request, work, idempotency_key=idempotency_key)


async def mesh_serve(
    ctx: Context,
    name: Annotated[str, Field(max_length=MAX_PROCEDURE, description="e.g. org.example.lint")],
    exec: Annotated[
        str,
        Field(
            max_length=MAX_EXEC,
            description="command line, run with no shell; payload on stdin only",
        ),
    ],
    exec_timeout_seconds: Annotated[
        float, Field(ge=MIN_EXEC_TIMEOUT_S, le=MAX_EXEC_TIMEOUT_S, description="per call")
    ] = DEFAULT_EXEC_TIMEOUT_S,
    realm: Realm = None,
    announce: Annotated[
        int, Field(ge=0, le=1, description="1: also list it in the DHT (signed)")
    ] = 1,
    rate_per_minute: Annotated[
        int, Field(ge=1, le=MAX_RATE_PER_MINUTE, description="calls a minute per caller")
    ] = DEFAULT_RATE_PER_MINUTE,
    allow: Annotated[
        str,
        Field(
            max_length=max(len(mode) for mode in ALLOW_MODES),
            description="open: any caller; allowlist: only your contact allowlist; owner: "
            "each call waits for your owner's approval",
        ),
    ] = "open",
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    tag = parse_realm(realm)
    if isinstance(tag, CallToolResult):
        return tag
    if allow not in ALLOW_MODES:
        return bad_argument("allow", f"must be one of {', '.join(ALLOW_MODES)}")
    if problem := procedure_problem(name, serving=True):
        return bad_argument("name", problem)
    argv = parse_exec(exec)
    if isinstance(argv, CallToolResult):
        return argv
    if idempotency_key == "":  # its length bound: the signature's IdempotencyKey
        return bad_argument("idempotency_key", f"must be 1-{MAX_IDEMPOTENCY_KEY} characters")

    gate = ServeGate(name, rate_per_minute, allow, runtime.agent.rings.policy)

    async def work() -> dict[str, Any]:
        return await _serve(runtime, name, exec, argv, exec_timeout_seconds, tag, announce, gate)

    request = {"name": name, "exec": exec, "exec_timeout_seconds": exec_timeout_seconds,
               "realm": tag.hex(), "announce": announce,
               "rate_per_minute": rate_per_minute, "allow": allow}  # fmt: skip
    return await run_tool(runtime, "mesh_serve", request, work, mesh=False,
                          idempotency_key=process_scoped(idempotency_key))  # fmt: skip


async def mesh_unserve(
    ctx: Context,
    name: Annotated[str, Field(max_length=MAX_PROCEDURE)],
    realm: Annotated[Realm, Field(description="default: the realm it is served in")] = None,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    tag = None if realm is None else parse_realm(realm)
    if isinstance(tag, CallToolResult):
        return tag
    if problem := procedure_problem(name, serving=False):
        return bad_argument("name", problem)

    async def work() -> dict[str, Any]:
        entry = runtime.served.get(name)
        if entry is None or (tag is not None and entry["realm"] != tag.hex()):
            where = "" if tag is None else f" in realm {tag.hex()[:16]}…"
            served = ", ".join(sorted(runtime.served)) or "nothing"
            raise InvalidArgument(f"name: {name!r} is not served here{where} (served: {served})")
        await runtime.node.unadvertise(bytes.fromhex(entry["realm"]), name)
        del runtime.served[name]
        return {"name": name, "realm": entry["realm"], "stopped": 1,
                "calls": entry["calls"], "errors": entry["errors"],
                "refused": entry["refused"],
                "rate_limited": entry["rate_limited"]}  # fmt: skip

    request = {"name": name, "realm": None if tag is None else tag.hex()}
    return await run_tool(runtime, "mesh_unserve", request, work, mesh=False,
                          idempotency_key=idempotency_key)  # fmt: skip


# every tool of this group, in tools/list order, with its hints
TOOLS = (
    (mesh_call, hints(read_only=False, destructive=True, idempotent=False)),
    (mesh_serve, hints(read_only=False, destructive=True, idempotent=True)),
    (mesh_unserve, hints(read_only=False, destructive=True, idempotent=True)),
)


def register(app: MCPServer, describe: Descriptions) -> None:
    register_tools(app, describe, TOOLS)


async def _serve(
    runtime: Runtime,
    name: str,
    command: str,
    argv: list[str],
    timeout: float,
    realm: bytes,
    announce: int,
    gate: ServeGate,
) -> dict[str, Any]:
    previous = runtime.served.get(name)
    if previous is not None and previous["realm"] != realm.hex():
        await runtime.node.unadvertise(bytes.fromhex(previous["realm"]), name)
    entry: dict[str, Any] = {"exec": command, "realm": realm.hex(), "timeout": timeout,
                             "calls": 0, "errors": 0, "running": 0, "last_error": None,
                             "since_ms": now_ms(), "announced": 0, "refused": 0,
                             "rate_limited": 0, "rate_per_minute": gate.rate_per_minute,
                             "allow": gate.allow}  # fmt: skip
    runtime.served[name] = entry
    held = HeldCalls(runtime.agent.approvals, functools.partial(_owner_runner, runtime))
    handler = _handler(name, argv, timeout, entry, gate, held, runtime.agent.audit)
    result: dict[str, Any] = {"name": name, "realm": realm.hex(), "exec": command,
                              "exec_timeout_seconds": timeout, "serving": 1,
                              "rate_per_minute": gate.rate_per_minute, "allow": gate.allow,
                              "replaced": int(previous is not None),
                              "node_id": runtime.node.identity.node_id.hex()}  # fmt: skip
    in_realm = await _advertised(runtime, realm, name, handler)
    try:  # the station took the ADVERTISE; only the DHT record may fail now
        if announce:
            announcing = runtime.node.advertise(realm, name, handler, announce=True)
            await asyncio.wait_for(announcing, ANNOUNCE_TIMEOUT_S)
        entry["announced"] = announce
    except (MaculaError, TimeoutError, OSError) as exc:
        reason = str(exc) or f"no DHT answer in {ANNOUNCE_TIMEOUT_S:g} s"
        log.warning("serving %s, but its procedure_advertisement was not stored: %s", name, reason)
        result["announce_error"] = reason
    result["announced"] = entry["announced"]
    return result | in_realm


def _owner_runner(runtime: Runtime, name: str) -> Runner | None:
    """The runner of ``name`` if its calls wait for the owner now (``allow="owner"``, or the
    owner's ``served_calls``)."""
    entry = runtime.served.get(name)
    if entry is None:
        return None
    if entry.get("allow") != "owner" and not runtime.agent.approvals.settings().served_calls:
        return None
    run: Runner = entry["run"]
    return run


async def _advertised(
    runtime: Runtime, realm: bytes, name: str, handler: Callable[[IncomingCall], Any]
) -> dict[str, Any]:
    """ADVERTISE ``name`` (no DHT record yet) and make sure the station took it: a refusal
    (``realm_refused``, ``advertise_taken``...), or no station to ask, withdraws the local
    handler and the entry and fails the tool, so nothing pretends to serve what callers
    cannot reach."""
    try:
        before = await acting(runtime, realm, ADVERTISE_REFUSALS)
        await runtime.node.advertise(realm, name, handler)
        return await check(runtime, before)
    except (InvalidArgument, MaculaError, TimeoutError):
        await runtime.node.unadvertise(realm, name)  # a no-op if it was never advertised
        runtime.served.pop(name, None)
        raise
