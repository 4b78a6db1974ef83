"""``relay.station.quic_server.ProtocolsByCid``: the connection-id map of the station's QUIC server
keeps
its reverse index through every write the library makes, and a connection's ending removes
exactly the ids that still name it (issue 27: no scan of every connection's ids)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from relay.station.quic_server import ProtocolsByCid, StationQuicServer


class Protocol:
    """Stands for a connection's protocol (hashed by identity, as the library's are)."""


def consistent(table: ProtocolsByCid) -> bool:
    rebuilt: dict[object, set[bytes]] = {}
    for cid, protocol in table.items():
        rebuilt.setdefault(protocol, set()).add(cid)
    return rebuilt == table.cids_of


def test_an_ending_removes_its_ids_and_no_other() -> None:
    a, b = Protocol(), Protocol()
    table = ProtocolsByCid()
    table[b"a1"], table[b"a2"], table[b"b1"] = a, a, b
    table.forget(a)
    assert dict(table) == {b"b1": b} and consistent(table)
    table.forget(a)  # twice: nothing more
    assert dict(table) == {b"b1": b}


def test_a_retired_id_and_a_reused_id_leave_the_index_right() -> None:
    a, b = Protocol(), Protocol()
    table = ProtocolsByCid()
    table[b"x"], table[b"y"] = a, a
    del table[b"x"]  # retired (the library's _connection_id_retired)
    table[b"y"] = b  # an id now naming another connection
    assert consistent(table) and a not in table.cids_of
    table.forget(a)
    assert dict(table) == {b"y": b}
    table.clear()
    assert not table and not table.cids_of


@given(
    st.lists(
        st.tuples(st.sampled_from(["set", "del", "forget"]), st.integers(0, 5), st.integers(0, 2))
    )
)
def test_the_index_matches_the_map_after_any_writes(ops: list[tuple[str, int, int]]) -> None:
    protocols = [Protocol() for _ in range(3)]
    table, plain = ProtocolsByCid(), {}
    for op, cid_n, p_n in ops:
        cid, protocol = bytes([cid_n]), protocols[p_n]
        if op == "set":
            table[cid] = plain[cid] = protocol
        elif op == "del" and cid in plain:
            del table[cid], plain[cid]
        elif op == "forget":  # what the library's own scan removes
            table.forget(protocol)
            plain = {c: p for c, p in plain.items() if p is not protocol}
        assert dict(table) == plain and consistent(table)


def test_the_station_server_uses_it() -> None:
    server = StationQuicServer.__new__(StationQuicServer)
    server._protocols = ProtocolsByCid()
    a = Protocol()
    server._protocols[b"1"] = a
    server._connection_terminated(a)  # type: ignore[arg-type]
    assert not server._protocols
