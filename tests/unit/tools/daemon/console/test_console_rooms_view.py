"""The console's room list (``tools.daemon.console.rooms_view``): a room two hosted agents are in is
one entry naming both, its messages each once, its participants those who have not left."""

from __future__ import annotations

from typing import Any

from tools.daemon.console.rooms_view import known_names, merged_rooms

TOPIC = "agents.room." + "a" * 32


def message(mid: str, sender: str, kind: str = "remark_made", attested: int = 1) -> dict[str, Any]:
    return {"message_id": mid, "from": sender, "from_petname": f"pet-{sender}", "kind": kind,
            "attested": attested, "text": mid}  # fmt: skip


def identity(node: str, rooms: list[dict[str, Any]], **names: Any) -> dict[str, Any]:
    return {"node_id": node, "petname": f"pet-{node}", "rooms": rooms, "directory": [], **names}


def room(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"room_topic": TOPIC, "realm": "00" * 32, "private": 0, "unread": 1,
            "purpose": None, "role": "member", "messages": messages, **extra}  # fmt: skip


def test_a_room_two_hosts_are_in_is_listed_once_with_both() -> None:
    opened = message("m1", "a", kind="room_opened") | {"purpose": "the deploy"}
    a = identity("a", [room([opened, message("m2", "b")], role="opener")], agent_name="reviewer")
    b = identity("b", [room([message("m2", "b"), message("m3", "c")])], operator_name="Bo")
    [merged] = merged_rooms([a, b])
    assert merged["purpose"] == "the deploy"
    assert [(h["node_id"], h["role"], h["agent_name"]) for h in merged["hosts"]] == [
        ("a", "opener", "reviewer"),
        ("b", "member", None),
    ]
    assert [m["message_id"] for m in merged["messages"]] == ["m1", "m2", "m3"]
    assert [p["node_id"] for p in merged["participants"]] == ["a", "b", "c"]
    assert merged["unread"] == 2


def test_participants_leave_out_who_left_and_unattested_senders() -> None:
    messages = [message("m1", "c"), message("m2", "c", kind="participant_left"),
                message("m3", "d", attested=0), message("m4", "e")]  # fmt: skip
    [merged] = merged_rooms([identity("a", [room(messages, purpose="talk")])])
    assert [p["node_id"] for p in merged["participants"]] == ["a", "e"]
    assert merged["purpose"] == "talk"


def test_names_come_from_hosted_settings_then_directory_rows() -> None:
    a = identity("a", [], agent_name="reviewer", operator_name="Ann")
    a["directory"] = [{"node_id": "z", "operator_name": "Zoe"}, {"node_id": "y"}]
    b = identity("b", [])
    b["directory"] = "the directory could not be read"
    assert known_names([a, b]) == {
        "z": {"agent_name": None, "operator_name": "Zoe"},
        "a": {"agent_name": "reviewer", "operator_name": "Ann"},
    }
    assert merged_rooms([a, b]) == []
