"""Station policy: the limits and switches an operator sets, and the token bucket they use.

Pure data and arithmetic; time is always an argument.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum


class PuzzleMode(StrEnum):
    OFF = "off"
    LOG = "log"
    ENFORCE = "enforce"


@dataclass(frozen=True, slots=True)
class Quotas:
    """Per-connection limits (PROTOCOL.md §13 #19). Rates are per second with a burst."""

    max_subscriptions: int = 4096
    max_advertisements: int = 512
    max_pending_calls: int = 1024
    max_streams: int = 128
    publish_rate: float = 2000.0
    publish_burst: float = 4000.0
    call_rate: float = 2000.0
    call_burst: float = 4000.0
    # bytes written to a connection's control stream that QUIC has not sent yet (the client is
    # not keeping up); past this the station says GOODBYE slow_consumer and closes it
    max_outbound_bytes: int = 16 * 1024 * 1024
    # --- a station peer (a link, docs/federation.md) carries all its clients' traffic, so its
    # bounds are larger than a client's: procedures it may advertise (its clients' adverts),
    # CALLs it may have in flight here, dedicated streams it may hold open
    max_station_advertisements: int = 10_000
    max_station_pending_calls: int = 16_384
    max_station_streams: int = 4_096
    # subscriptions a peer *station* may hold (the topics all its clients follow)
    max_station_subscriptions: int = 100_000
    # EVENTs a peer station may send per second (burst: twice that), all its publishers'
    # together; over it the link's control stream is paused (backpressure), not dropped
    station_event_rate: float = 20_000.0
    station_event_burst: float = 40_000.0


@dataclass(frozen=True, slots=True)
class StationPolicy:
    puzzle_mode: PuzzleMode = PuzzleMode.OFF
    puzzle_difficulty: int = 8
    # §13 #1: frames whose sent_at_ms is further than this from the station clock are refused;
    # frame ids are remembered for twice this long. 0 turns both checks off.
    max_clock_skew_ms: int = 300_000
    # frame ids remembered per node; past this, frames older than the oldest forgotten one
    # are refused (memory stays bounded under any publish rate)
    replay_cache_per_node: int = 200_000
    quotas: Quotas = Quotas()
    handshake_timeout_ms: int = 10_000
    forward_slot_ms: int = 60_000
    stream_route_ttl_ms: int = 300_000
    drain_ms: int = 5_000
    advertise_tombstone_ms: int = 10_000
    # frames on content and stream-RPC streams (the protocol's ceiling, §2.1)
    max_frame_size: int = 0x00FFFFFF
    # --- bounds on what one peer can make the station hold or do (issue 11) ---
    # frames on a control stream (the first stream a peer sends on); larger: framing error
    max_control_frame_size: int = 1 << 20
    # CBOR items in one frame body (each costs ~1 us to decode; this bounds one frame's
    # event-loop time): control streams, then content and stream-RPC streams
    max_control_frame_items: int = 8_192
    max_stream_frame_items: int = 16_384
    # UTF-8 bytes of a topic or procedure name (realms are exactly 32 bytes by the wire)
    max_name_bytes: int = 256
    # bytes a connection may send, on its first stream only, before its CONNECT is accepted
    max_pre_handshake_bytes: int = 64 * 1024
    # open connections (handshaken or not), in all and per source address (loopback included)
    max_connections: int = 10_000
    max_connections_per_address: int = 256
    # QUIC address validation (Retry) when the station is not bound to a loopback address
    quic_retry: bool = True
    # at most one log line summing up a connection's refused frames per this interval
    log_summary_ms: int = 10_000
    # --- federation (docs/federation.md) ---
    # CALLs this station itself has in flight on its links (``RouterCore.call_station``)
    max_station_calls: int = 1_024
    # a content block or manifest missing here is asked of at most this many linked stations,
    # each given this long to answer
    content_fanout: int = 3
    content_fetch_timeout_ms: int = 2_000
    # EVENTs from peer stations: (realm, publisher, seq) remembered this long, at most this many
    relayed_event_dedup_ms: int = 300_000
    max_relayed_event_ids: int = 200_000
    # the replay window of one station link (frames of many signers): frame ids remembered,
    # and signers whose replay floor is remembered (past that, one floor for the whole link)
    replay_cache_per_link: int = 1_000_000
    replay_signers_per_link: int = 100_000
    # links other stations open to this one (those this one dials: ``max_links``); a CONNECT
    # with the station bit over it is refused (HELLO "false", 0x08 upstream_congestion)
    max_inbound_links: int = 64
    # --- protected realms (relay.realms.gate, issue 13) ---
    # memberships are re-checked (expiry, revocations in the record store) at least this often
    realm_sweep_ms: int = 60_000
    # endorsements one _realm.present call (or one CONNECT) may carry
    max_presented_endorsements: int = 16
    # revocations remembered (the soonest to expire is forgotten first past this)
    max_realm_revocations: int = 100_000


# what a running station may change (``RouterCore.reconfigure``, relay.ops.reload): the quotas read
# per frame, and the realms' sweep interval; everything else is read once, as the station starts
LIVE_QUOTAS = frozenset(
    {
        "max_subscriptions",
        "max_advertisements",
        "max_pending_calls",
        "max_streams",
        "publish_rate",
        "publish_burst",
        "call_rate",
        "call_burst",
        "max_outbound_bytes",
        "max_station_pending_calls",
        "max_station_streams",
        "max_station_subscriptions",
    }
)
LIVE_POLICY = frozenset({"quotas", "realm_sweep_ms"})


def restart_only_changes(old: StationPolicy, new: StationPolicy) -> list[str]:
    """The fields ``new`` changes that a running station cannot take (``quotas.<name>`` for a
    quota), in declaration order: only a restart applies them."""
    changed = [
        f.name
        for f in fields(StationPolicy)
        if f.name not in LIVE_POLICY and getattr(old, f.name) != getattr(new, f.name)
    ]
    return changed + [
        f"quotas.{f.name}"
        for f in fields(Quotas)
        if f.name not in LIVE_QUOTAS and getattr(old.quotas, f.name) != getattr(new.quotas, f.name)
    ]


class ReplayWindow:
    """Frame ids one node has used (§13 #1), bounded in memory.

    Ids are kept in arrival order with their ``sent_at_ms``. Beyond ``capacity`` the oldest is
    forgotten and its time becomes a floor: a frame sent at or before the floor is refused,
    since it might be a replay of a forgotten one. Honest clients stamp frames as they send
    them, so only frames delayed longer than the window spans are affected.
    """

    __slots__ = ("capacity", "floor_ms", "seen")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.floor_ms = -1
        self.seen: dict[bytes, int] = {}

    def admit(self, frame_id: bytes, sent_at_ms: int) -> bool:
        if sent_at_ms <= self.floor_ms or frame_id in self.seen:
            return False
        self.seen[frame_id] = sent_at_ms
        if len(self.seen) > self.capacity:
            oldest = next(iter(self.seen))
            self.floor_ms = max(self.floor_ms, self.seen.pop(oldest))
        return True

    def forget_before(self, oldest_ms: int) -> None:
        """Drop ids sent before ``oldest_ms`` (they fail the skew check anyway)."""
        seen = self.seen
        while seen:
            first = next(iter(seen))
            if seen[first] >= oldest_ms:
                break
            del seen[first]
