"""Live check: a private realm with its authority, join service and members in separate processes.

A station process, the realm owner's ``macula-realm`` commands (``create``, ``serve`` running
in its own process, ``pending``, ``approve``, ``deny``, ``members``, ``revoke``) and two member
processes (each a Node with its own identity, a membership store and the join flow). Checks:
the key is 0600; a join returns a code the owner sees pending; a wrong code is refused (exit 1);
approving stores a verified endorsement (0600, no code in it) and lists the realm; the
endorsement is in the DHT; a denied member stays out; a replayed join request is refused; a
revocation reaches the DHT and removes the membership from the member.

``uv run python scripts/realm-two-process-check.py [--station node_id@host:port]``
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from livecheck import (
    REPO,
    Checks,
    LocalStation,
    ScriptChild,
    check_main,
    child_args,
    serve_ops,
    stdin_lines,
)

NAME = "org.macula.livecheck.crew"
REALM_CLI = [sys.executable, "-m", "macula.realm.cli", "--json"]


def realm_cli(home: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [*REALM_CLI, "--home", str(home), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    try:
        return done.returncode, dict(json.loads(done.stdout))
    except ValueError:
        return done.returncode, {"stderr": done.stderr[-500:]}


class MemberChild(ScriptChild):
    """A member process: ``realm-two-process-check.py child``; JSON lines in and out."""

    def __init__(self, name: str, station: str, workdir: Path) -> None:
        super().__init__(__file__, name, station, workdir)


def body(checks: Checks, station: LocalStation | None, workdir: Path, endpoint: str) -> None:
    owner = workdir / "owner"
    code, created = realm_cli(owner, "create", NAME)
    key_file = owner / "realms" / NAME / "authority.key"
    checks.check(
        "macula-realm create: exit 0, authority key 0600",
        code == 0 and key_file.stat().st_mode & 0o777 == 0o600,
        str(created),
    )
    serve = subprocess.Popen(
        [
            *REALM_CLI,
            "--home",
            str(owner),
            "serve",
            "--station",
            endpoint,
            "--publish-every-s",
            "0.5",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    ada = MemberChild("ada", endpoint, workdir)
    bob = MemberChild("bob", endpoint, workdir)
    try:
        assert serve.stdout is not None
        said = json.loads(serve.stdout.readline() or "{}")
        checks.check(
            "macula-realm serve runs the join service in its own process",
            said.get("serving") == 1,
            said.get("procedure", ""),
        )
        ticket = ada.request("join", realm=NAME)
        checks.check(
            "a join returns a code and a link, status pending",
            ticket.get("status") == "pending" and len(ticket.get("code", "")) == 9,
            ticket.get("error", ""),
        )
        code, pending = realm_cli(owner, "pending")
        codes = [p["code"] for p in pending.get("pending", [])]
        checks.check("the owner sees the request pending", codes == [ticket.get("code")])
        code, wrong = realm_cli(owner, "approve", "2222-2222")
        checks.check(
            "a wrong code is refused (exit 1, unknown_code)",
            code == 1 and wrong.get("code") == "unknown_code",
        )
        code, approved = realm_cli(owner, "approve", str(ticket.get("link")))
        checks.check("approve by link: exit 0", code == 0 and approved.get("status") == "approved")
        outcome = ada.request("wait", realm=NAME, seconds=20)
        checks.check(
            "the member picks up the approval", outcome.get("status") == "approved", str(outcome)
        )
        listed = ada.request("list")
        names = [m["name"] for m in listed.get("realms", [])]
        checks.check("the member lists the realm (confirmed only)", names == [NAME])
        checks.check(
            "the membership file is 0600 and holds no code",
            listed.get("mode") == 0o600 and not listed.get("has_code"),
        )
        roles = ada.request("dht_roles", realm=NAME, timeout=10, until="member")
        checks.check("the endorsement is in the DHT", roles.get("roles") == ["member"], str(roles))

        denied_ticket = bob.request("join", realm=NAME)
        code, _ = realm_cli(owner, "deny", str(denied_ticket.get("code")))
        outcome = bob.request("wait", realm=NAME, seconds=20)
        checks.check(
            "a denied member stays out",
            code == 0
            and outcome.get("status") == "denied"
            and bob.request("list").get("realms") == [],
        )
        replay = bob.request("replay", realm=NAME)
        checks.check(
            "a replayed join request is refused", replay.get("second") == "replayed", str(replay)
        )

        code, members = realm_cli(owner, "members")
        node = members["members"][0]["node"] if members.get("members") else ""
        code, revoked = realm_cli(owner, "revoke", node)
        checks.check("revoke: exit 0", code == 0 and revoked.get("status") == "revoked")
        roles = ada.request("dht_roles", realm=NAME, timeout=10, until="revoked")
        checks.check(
            "the revocation replaced the endorsement in the DHT",
            roles.get("roles") == ["revoked"],
            str(roles),
        )
        after = ada.request("refresh")
        checks.check(
            "the member's membership is gone after the revocation",
            after.get("realms") == [],
            str(after),
        )
    finally:
        ada.close()
        bob.close()
        serve.terminate()
        serve.wait(timeout=20)


# --- child side ------------------------------------------------------------------------------


async def _child(station: str, home: Path) -> None:
    sys.path.insert(0, str(REPO))
    from macula.errors import MaculaError
    from macula.keyfile import load_or_create_identity
    from macula.node.node import Node
    from macula.realm.join import build_request
    from macula.realm.joiner import RealmJoiner, Ticket
    from macula.realm.membership import MembershipStore, memberships_path
    from macula.realm.records import join_procedure, read_member_record
    from macula.wire.identity import ZERO_REALM, realm_tag
    from macula.wire.record_keys import member_endorsement_key

    identity = load_or_create_identity(home / "id.key")
    store = MembershipStore(memberships_path(home, identity.node_id), identity)
    reader = await stdin_lines()
    codes: list[str] = []

    async with Node(identity, [station], presenter=store.present_on) as node:
        joiner = RealmJoiner(node, store, node._spawn_task, poll_every_s=0.2)

        async def join(a: dict[str, Any]) -> dict[str, Any]:
            started = await joiner.start(a["realm"])
            if isinstance(started, Ticket):
                codes.append(started.code)
                return {"status": "pending", "code": started.code, "link": started.link}
            return started

        def listing() -> dict[str, Any]:
            text = store.path.read_text() if store.path.exists() else ""
            return {
                "realms": [m.view() for m in store.memberships()],
                "mode": store.path.stat().st_mode & 0o777 if store.path.exists() else 0,
                "has_code": int(any(c.replace("-", "") in text or c in text for c in codes)),
            }

        async def dht_roles(a: dict[str, Any]) -> dict[str, Any]:
            key = member_endorsement_key(realm_tag(a["realm"]), identity.node_id)
            deadline = time.monotonic() + 10
            roles: list[str] = []
            while time.monotonic() < deadline:
                found = await node.dht.find_records(key)
                roles = [read_member_record(r, authority=r.key).role for r in found]
                if roles == [a["until"]]:
                    break
                await asyncio.sleep(0.2)  # polling the DHT for the serve process's put
            return {"roles": roles}

        async def replay(a: dict[str, Any]) -> dict[str, Any]:
            procedure = join_procedure(a["realm"])
            about = await node.call(ZERO_REALM, procedure, {"op": "about"})
            request = build_request(
                identity, a["realm"], about["service"], "poll", int(time.time() * 1000)
            )
            first = await node.call(ZERO_REALM, procedure, request)
            second = await node.call(ZERO_REALM, procedure, request)
            return {"first": first.get("status"), "second": second.get("reason")}

        async def refresh(a: dict[str, Any]) -> dict[str, Any]:
            await store.refresh(node.dht)
            return listing()

        async def wait(a: dict[str, Any]) -> dict[str, Any]:
            return await joiner.wait(a["realm"], a["seconds"])

        async def list_(a: dict[str, Any]) -> dict[str, Any]:
            return listing()

        ops = {
            "join": join,
            "wait": wait,
            "list": list_,
            "dht_roles": dht_roles,
            "replay": replay,
            "refresh": refresh,
        }
        await serve_ops(reader, ops, (MaculaError, KeyError, ValueError, OSError))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        args = child_args()
        os.makedirs(args.home, mode=0o700, exist_ok=True)
        asyncio.run(_child(args.station, args.home))
        return
    check_main(__doc__ or "", body)


if __name__ == "__main__":
    main()
