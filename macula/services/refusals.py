"""The reasons a station gives when it refuses a frame without an answer on the wire.

A station counts each such refusal on the connection under one of these names, and answers a
``_relay.ping`` with the counters (``Node.flush``, ``Node.refusals``). The station's router
(``relay/``) counts under them, ``Node`` reports them to library callers, and the MCP layer
(``tools.groups.realm_access``) turns a rise into a tool error named after the reason.

Invariants:
- one constant per reason, its value the name on the wire (``_relay.ping``'s ``refused`` map);
- ``MEANING`` says, for every reason, what the station refused and why, in words for a reader;
- ``PUBLISH_REFUSALS`` / ``SUBSCRIBE_REFUSALS`` / ``ADVERTISE_REFUSALS``: what a PUBLISH,
  SUBSCRIBE or ADVERTISE from a client may meet (a rise in one while a caller acted is the
  refusal of what it did).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

# -- ADVERTISE / UNADVERTISE ----------------------------------------------------------------
FOREIGN_ADVERTISE: Final = "foreign_advertise"
BUILTIN_ADVERTISE: Final = "builtin_advertise"
RESERVED_ADVERTISE: Final = "reserved_advertise"
ADVERTISE_TAKEN: Final = "advertise_taken"
ADVERTISE_TOMBSTONED: Final = "advertise_tombstoned"
ADVERTISE_QUOTA: Final = "advertise_quota"
FOREIGN_UNADVERTISE: Final = "foreign_unadvertise"
UNKNOWN_UNADVERTISE: Final = "unknown_unadvertise"
# -- SUBSCRIBE / UNSUBSCRIBE ----------------------------------------------------------------
FOREIGN_SUBSCRIBE: Final = "foreign_subscribe"
SUBSCRIPTION_QUOTA: Final = "subscription_quota"
FOREIGN_UNSUBSCRIBE: Final = "foreign_unsubscribe"
# -- PUBLISH --------------------------------------------------------------------------------
FOREIGN_PUBLISH: Final = "foreign_publish"
BAD_PUBLISHER_SIG: Final = "bad_publisher_sig"
PUBLISH_RATE_LIMITED: Final = "publish_rate_limited"
PUBLISH_SLOWED: Final = "publish_slowed"
# -- realms ---------------------------------------------------------------------------------
REALM_REFUSED: Final = "realm_refused"
REALM_RESULT_UNVOUCHED: Final = "realm_result_unvouched"
REALM_EVENT_UNSIGNED: Final = "realm_event_unsigned"
REALM_PUBLISHER_UNVOUCHED: Final = "realm_publisher_unvouched"
EVENT_FROM_CLIENT: Final = "event_from_client"
# -- any frame ------------------------------------------------------------------------------
DROPPED_BEFORE_CONNECT: Final = "dropped_before_connect"
MALFORMED_FRAME: Final = "malformed_frame"
UNKNOWN_FRAME_TYPES: Final = "unknown_frame_types"
NAME_TOO_LONG: Final = "name_too_long"
UNVERIFIED_FRAME: Final = "unverified_frame"
FOREIGN_SIGNER: Final = "foreign_signer"
MISPLACED_FRAME: Final = "misplaced_frame"
# -- calls and streams ----------------------------------------------------------------------
UNEXPECTED_REPLY: Final = "unexpected_reply"
STREAM_QUOTA: Final = "stream_quota"
FOREIGN_STREAM_OPEN: Final = "foreign_stream_open"
BAD_STREAM_FRAME: Final = "bad_stream_frame"
# -- from a linked station (a client never meets these) -------------------------------------
DROPPED_BEFORE_HELLO: Final = "dropped_before_hello"
LINK_HELLO_INVALID: Final = "link_hello_invalid"
LINKS_REFUSED: Final = "links_refused"
EVENTS_SLOWED: Final = "events_slowed"
FORGED_ATTESTATION: Final = "forged_attestation"
UNSIGNED_RELAYED_EVENT: Final = "unsigned_relayed_event"
UNWANTED_RELAYED_EVENT: Final = "unwanted_relayed_event"
BAD_RELAYED_PUBLISHER_SIG: Final = "bad_relayed_publisher_sig"
DUPLICATE_RELAYED_EVENT: Final = "duplicate_relayed_event"
STATION_ADVERTISE_QUOTA: Final = "station_advertise_quota"
NO_GOSSIP: Final = "no_gossip"
MESH_BAD_LIST: Final = "mesh_bad_list"
MESH_LIST_TOO_LONG: Final = "mesh_list_too_long"
MESH_BAD_RECORD: Final = "mesh_bad_record"
MESH_NOT_ENDPOINT: Final = "mesh_not_endpoint"
MESH_BAD_ENDPOINT: Final = "mesh_bad_endpoint"
MESH_REFUSED_PREFIX: Final = "mesh_refused_"  # + the record store's reason (``stale``...)

MEANING: Final[Mapping[str, str]] = {
    FOREIGN_ADVERTISE: "an ADVERTISE naming another node than this connection's",
    BUILTIN_ADVERTISE: "an ADVERTISE of a built-in procedure of the station",
    RESERVED_ADVERTISE: "an ADVERTISE of a house service's name (only the station serves it)",
    ADVERTISE_TAKEN: "an ADVERTISE of a procedure another node serves in that realm",
    ADVERTISE_TOMBSTONED: "an ADVERTISE of a name another node released a moment ago",
    ADVERTISE_QUOTA: "an ADVERTISE past this connection's advertisement quota",
    FOREIGN_UNADVERTISE: "an UNADVERTISE of a procedure another node serves",
    UNKNOWN_UNADVERTISE: "an UNADVERTISE of a procedure the station did not know",
    FOREIGN_SUBSCRIBE: "a SUBSCRIBE naming another node than this connection's",
    SUBSCRIPTION_QUOTA: "a SUBSCRIBE past this connection's subscription quota",
    FOREIGN_UNSUBSCRIBE: "an UNSUBSCRIBE naming another node than this connection's",
    FOREIGN_PUBLISH: "a PUBLISH naming another publisher than this connection's node",
    BAD_PUBLISHER_SIG: "a PUBLISH whose publisher_sig does not verify",
    PUBLISH_RATE_LIMITED: "a PUBLISH above the station's publish rate",
    PUBLISH_SLOWED: "reading paused: PUBLISH frames came faster than the station's rate",
    REALM_REFUSED: "a frame in a realm the station protects, without a valid membership",
    REALM_RESULT_UNVOUCHED: "an answer in a protected realm from a node not vouched for",
    REALM_EVENT_UNSIGNED: "an EVENT of a protected realm without a publisher_sig",
    REALM_PUBLISHER_UNVOUCHED: "an EVENT of a protected realm from a publisher not vouched for",
    EVENT_FROM_CLIENT: "an EVENT from a connection that is not a station",
    DROPPED_BEFORE_CONNECT: "a frame before CONNECT",
    MALFORMED_FRAME: "a frame that does not decode",
    UNKNOWN_FRAME_TYPES: "a frame of a type this station does not know",
    NAME_TOO_LONG: "a topic or procedure name longer than the station allows",
    UNVERIFIED_FRAME: "a frame whose signature does not verify",
    FOREIGN_SIGNER: "a frame signed by another node than this connection's",
    MISPLACED_FRAME: "a frame on a stream where it does not belong",
    UNEXPECTED_REPLY: "a reply to a call the station did not forward to this connection",
    STREAM_QUOTA: "a dedicated stream past this connection's quota",
    FOREIGN_STREAM_OPEN: "a STREAM_OPEN naming another caller than this connection's",
    BAD_STREAM_FRAME: "a stream frame that does not fit its route",
    DROPPED_BEFORE_HELLO: "a frame on a station link before its HELLO",
    LINK_HELLO_INVALID: "a station link whose HELLO does not fit",
    LINKS_REFUSED: "a station link this station does not take now",
    EVENTS_SLOWED: "reading paused: a link sent EVENT frames faster than its rate",
    FORGED_ATTESTATION: "a relayed EVENT claiming another station's attestation",
    UNSIGNED_RELAYED_EVENT: "a relayed EVENT of a protected realm without publisher_sig",
    UNWANTED_RELAYED_EVENT: "a relayed EVENT for a topic no client here follows",
    BAD_RELAYED_PUBLISHER_SIG: "a relayed EVENT whose publisher_sig does not verify",
    DUPLICATE_RELAYED_EVENT: "a relayed EVENT already delivered",
    STATION_ADVERTISE_QUOTA: "a linked station's ADVERTISE past its gossip quota",
    NO_GOSSIP: "a linked station's ADVERTISE when this station keeps no gossip",
    MESH_BAD_LIST: "a station list from a link that does not decode",
    MESH_LIST_TOO_LONG: "a station list from a link longer than allowed",
    MESH_BAD_RECORD: "a record in a link's station list that does not decode",
    MESH_NOT_ENDPOINT: "a record in a link's station list that is no station_endpoint",
    MESH_BAD_ENDPOINT: "a station_endpoint in a link's station list that does not fit",
}

PUBLISH_REFUSALS: Final = frozenset(
    {REALM_REFUSED, PUBLISH_RATE_LIMITED, BAD_PUBLISHER_SIG, FOREIGN_PUBLISH}
)
SUBSCRIBE_REFUSALS: Final = frozenset({REALM_REFUSED, SUBSCRIPTION_QUOTA, FOREIGN_SUBSCRIBE})
ADVERTISE_REFUSALS: Final = frozenset(
    {
        REALM_REFUSED,
        ADVERTISE_TAKEN,
        ADVERTISE_TOMBSTONED,
        ADVERTISE_QUOTA,
        RESERVED_ADVERTISE,
        BUILTIN_ADVERTISE,
        FOREIGN_ADVERTISE,
    }
)
