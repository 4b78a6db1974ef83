"""The console's rooms, one entry per room: the identities this daemon hosts each see their own
copy of a room; the page lists it once, headed by its purpose and participants, saying which
hosted agents are in it. Pure: it reads the identity views ``tools.daemon.console.snapshot`` built.

Invariants:
- one entry per room topic, in the order rooms first appear across identities (sorted by
  node id, as the snapshot lists them);
- ``hosts`` lists every hosted identity in the room with its role and unread count and the
  names a person gave it (``agent_name``, ``operator_name``: None when none was given);
- ``participants`` are the hosted agents in the room, then every sender seen in its recent
  messages (attested ones only) whose last word was not ``participant_left``;
- ``messages`` are the fullest host's copy, then any message only another host saw, each once;
- ``names`` maps a node id to the names a person gave it (hosted agents' settings, directory
  rows' ``operator_name``), so the page can show them beside every petname.
"""

from __future__ import annotations

from typing import Any, Final

LEFT: Final = "participant_left"


def _names(identity: dict[str, Any]) -> dict[str, Any]:
    return {
        "agent_name": identity.get("agent_name"),
        "operator_name": identity.get("operator_name"),
    }


def known_names(identities: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """node id -> ``{agent_name, operator_name}`` for everyone a person named, hosted first."""
    names: dict[str, dict[str, Any]] = {}
    for identity in identities:
        rows = identity.get("directory")
        for row in rows if isinstance(rows, list) else []:
            operator = row.get("operator_name")
            if operator and row.get("node_id") not in names:
                names[row["node_id"]] = {"agent_name": None, "operator_name": operator}
    for identity in identities:
        given = _names(identity)
        if any(given.values()):
            names[identity["node_id"]] = given
    return names


def _participants(
    hosts: list[dict[str, Any]], messages: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    last: dict[str, tuple[str, str]] = {}
    for message in messages:
        sender = message.get("from")
        if message.get("attested") and isinstance(sender, str):
            last[sender] = (str(message.get("kind")), str(message.get("from_petname") or ""))
    seen = [{"node_id": h["node_id"], "petname": h["petname"]} for h in hosts]
    hosted = {h["node_id"] for h in hosts}
    for node, (kind, name) in last.items():
        if node not in hosted and kind != LEFT:
            seen.append({"node_id": node, "petname": name})
    return seen


def merged_rooms(identities: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every room any hosted identity is in, once (see the module invariants)."""
    rooms: dict[str, dict[str, Any]] = {}
    copies: dict[str, list[list[dict[str, Any]]]] = {}
    for identity in identities:
        for room in identity.get("rooms", []):
            topic = room["room_topic"]
            entry = rooms.setdefault(
                topic,
                {
                    "room_topic": topic,
                    "purpose": None,
                    "realm": room["realm"],
                    "private": 0,
                    "unread": 0,
                    "hosts": [],
                },
            )
            entry["purpose"] = entry["purpose"] or room.get("purpose") or _opened_purpose(room)
            entry["private"] = max(entry["private"], int(room.get("private", 0)))
            entry["unread"] += int(room.get("unread", 0))
            entry["hosts"].append(
                {
                    "node_id": identity["node_id"],
                    "petname": identity["petname"],
                    "role": room.get("role"),
                    "unread": int(room.get("unread", 0)),
                    **_names(identity),
                }
            )
            copies.setdefault(topic, []).append(room.get("messages", []))
    for topic, entry in rooms.items():
        entry["messages"] = _union(copies[topic])
        entry["participants"] = _participants(entry["hosts"], entry["messages"])
    return list(rooms.values())


def _opened_purpose(room: dict[str, Any]) -> str | None:
    for message in room.get("messages", []):
        if message.get("kind") == "room_opened":
            found = message.get("purpose") or message.get("text")
            return str(found) if found else None
    return None


def _union(copies: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    ordered = sorted(copies, key=len, reverse=True)
    seen: set[str] = set()
    merged = []
    for copy in ordered:
        for message in copy:
            key = str(message.get("message_id"))
            if key not in seen:
                seen.add(key)
                merged.append(message)
    return merged
