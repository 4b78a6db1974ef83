"""Room envelopes: the one message shape of central and rooms, its validation, and threading.

Invariants:
- Topics: central is ``agents.lobby``; a room is ``agents.room.<32 lowercase hex>``.
- An envelope is a JSON object with exactly the keys of ``Envelope``; an unknown key, a missing
  required key, a ``null`` or a boolean anywhere is a problem (flags are the ints 0/1).
- ``validate`` never raises and lists *every* problem it finds, each as ``"<field>: <why>"``;
  ``build_envelope`` only ever returns an envelope ``validate`` accepts.
- ``answer_given`` and ``result_reported`` carry ``in_reply_to``; talk kinds carry non-blank text.
- Private rooms (``macula.agent.room.crypto``): a sealed envelope carries ``cipher`` and an
  empty ``text`` and none of the other optional fields (they travel inside the box); the kind
  rules apply to the opened envelope. A ``key_distributed`` envelope carries ``room_key`` and
  nothing else optional. Only the shapes are checked here; the cryptography is room_crypto's.
- ``thread`` computes over the whole set, so input order does not matter: a reply seen before
  its parent threads under it, a reply to an unknown message is a root that keeps its
  ``in_reply_to``, and a reply cycle (self-reply included) is cut at its earliest message
  (smallest ``(sent_at, message_id)``), which becomes a root. Nothing recurses or loops.
No I/O, no clock, no hidden randomness (ids come from bytes passed in).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, NotRequired, TypedDict

from macula.errors import MaculaError

LOBBY_TOPIC: Final = "agents.lobby"
ROOM_TOPIC_PREFIX: Final = "agents.room."

KEY_KIND: Final = "key_distributed"  # a private room's key, sealed to each participant
LIFECYCLE_KINDS: Final = frozenset(
    {"room_opened", "participant_joined", "participant_left", "room_closed", KEY_KIND}
)
TALK_KINDS: Final = frozenset(
    {
        "question_asked",
        "answer_given",
        "help_offered",
        "help_requested",
        "task_handed_over",
        "result_reported",
        "remark_made",
    }
)
KINDS: Final = LIFECYCLE_KINDS | TALK_KINDS
REPLY_REQUIRED_KINDS: Final = frozenset({"answer_given", "result_reported"})

MAX_TEXT_BYTES: Final = 16 * 1024  # UTF-8 bytes
MAX_PURPOSE_CHARS: Final = 280
MAX_REFS: Final = 32
MAX_REF_CHARS: Final = 256
MAX_PARTICIPANTS: Final = 256
MAX_SENT_AT: Final = (1 << 53) - 1  # stays exact as a JSON number everywhere
MAX_CIPHER_CHARS: Final = 96 * 1024  # base64 of a sealed body (16 KiB text + refs + ...)
MAX_SEALED_KEYS: Final = 256  # recipients of one room key envelope
MAX_EPOCH: Final = (1 << 31) - 1

_ROOM_TOPIC: Final = re.compile(r"agents\.room\.[0-9a-f]{32}")
_NODE_HEX: Final = re.compile(r"[0-9a-f]{64}")
_HEX16: Final = re.compile(r"[0-9a-f]{16}")
_HEX32: Final = re.compile(r"[0-9a-f]{32}")
_SIG_HEX: Final = re.compile(r"[0-9a-f]{128}")
_BASE64: Final = re.compile(r"[A-Za-z0-9+/]+={0,2}")
# message and ring ids: short, and free of the ':' '#' '.' that procedure strings use
_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")

_REQUIRED: Final = ("message_id", "room_topic", "sent_at", "from", "kind", "text")
_OPTIONAL: Final = ("in_reply_to", "refs", "participants", "purpose", "cipher", "room_key")
SEALABLE: Final = ("text", "in_reply_to", "refs", "participants", "purpose")  # inside the box
_FIELDS: Final = _REQUIRED + _OPTIONAL
_KEYS: Final = frozenset(_FIELDS)

_Check = Callable[[object], list[str]]

Envelope = TypedDict(
    "Envelope",
    {
        "message_id": str,
        "room_topic": str,
        "in_reply_to": NotRequired[str],
        "sent_at": int,
        "from": str,
        "kind": str,
        "text": str,
        "refs": NotRequired[list[str]],
        "participants": NotRequired[list[str]],
        "purpose": NotRequired[str],
        "cipher": NotRequired[dict[str, object]],
        "room_key": NotRequired[dict[str, object]],
    },
)


class EnvelopeError(MaculaError, ValueError):
    """An envelope we were asked to build is invalid; ``problems`` lists every reason."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        super().__init__("invalid envelope: " + "; ".join(self.problems))


# -- small predicates shared by the agent layer -------------------------------------------------


def is_node_hex(value: object) -> bool:
    """True for a node id written as 64 lowercase hex characters."""
    return type(value) is str and _NODE_HEX.fullmatch(value) is not None


def is_id(value: object) -> bool:
    """True for a message or ring id: 1..64 characters of ``[A-Za-z0-9_-]``."""
    return type(value) is str and _ID.fullmatch(value) is not None


def is_room_topic(topic: object) -> bool:
    """True for ``agents.room.<32 lowercase hex>``."""
    return type(topic) is str and _ROOM_TOPIC.fullmatch(topic) is not None


def is_envelope_topic(topic: object) -> bool:
    """True for central or a room: the topics an envelope may travel on."""
    return topic == LOBBY_TOPIC or is_room_topic(topic)


def new_room_topic(random16: bytes) -> str:
    """A fresh, unguessable room topic from 16 random bytes."""
    if type(random16) is not bytes or len(random16) != 16:
        raise ValueError("a room topic needs exactly 16 random bytes")
    return ROOM_TOPIC_PREFIX + random16.hex()


def new_message_id(random16: bytes) -> str:
    """A fresh message id (32 lowercase hex) from 16 random bytes."""
    if type(random16) is not bytes or len(random16) != 16:
        raise ValueError("a message id needs exactly 16 random bytes")
    return random16.hex()


def bool_problems(value: object, where: str) -> list[str]:
    """A problem for every boolean inside ``value`` (lists and dicts searched), named by path."""
    problems: list[str] = []
    stack: list[tuple[object, str]] = [(value, where)]
    while stack:
        item, path = stack.pop()
        if type(item) is bool:
            problems.append(f"{path}: booleans are not allowed; use 0 or 1")
        elif isinstance(item, list):
            stack.extend((sub, f"{path}[{i}]") for i, sub in reversed(list(enumerate(item))))
        elif isinstance(item, dict):
            stack.extend((sub, f"{path}.{key}") for key, sub in reversed(list(item.items())))
    return problems


# -- validation ---------------------------------------------------------------------------------


def validate(envelope: object) -> list[str]:
    """Every problem with ``envelope``; an empty list means it is valid. Never raises."""
    if not isinstance(envelope, dict):
        return [f"envelope: expected a JSON object, got {type(envelope).__name__}"]
    problems: list[str] = []
    for key in envelope:
        if type(key) is not str:
            problems.append(f"{key!r}: keys must be strings")
        elif key not in _KEYS:
            problems.append(f"{key}: unknown key")
    problems.extend(f"{key}: missing" for key in _REQUIRED if key not in envelope)
    for key in _FIELDS:
        if key not in envelope:
            continue
        value = envelope[key]
        if value is None:
            problems.append(f"{key}: null is not allowed; omit the key instead")
        elif type(value) is bool:
            problems.append(f"{key}: booleans are not allowed; use 0 or 1")
        else:
            problems.extend(_FIELD_CHECKS[key](value))
    problems.extend(_kind_rules(envelope))
    return problems


def _check_id(name: str) -> _Check:
    def check(value: object) -> list[str]:
        if is_id(value):
            return []
        return [f"{name}: expected 1..64 characters of A-Z a-z 0-9 _ -"]

    return check


def _check_room_topic(value: object) -> list[str]:
    if is_envelope_topic(value):
        return []
    return [f"room_topic: expected {LOBBY_TOPIC!r} or 'agents.room.<32 lowercase hex>'"]


def _check_sent_at(value: object) -> list[str]:
    if type(value) is int and 0 <= value <= MAX_SENT_AT:
        return []
    return ["sent_at: expected an integer Unix time in milliseconds"]


def _check_from(value: object) -> list[str]:
    return [] if is_node_hex(value) else ["from: expected a 64 lowercase hex node id"]


def _check_kind(value: object) -> list[str]:
    if type(value) is str and value in KINDS:
        return []
    return [f"kind: expected one of {', '.join(sorted(KINDS))}"]


def _check_text(value: object) -> list[str]:
    if type(value) is not str:
        return ["text: expected a string"]
    if len(value.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
        return [f"text: longer than {MAX_TEXT_BYTES} UTF-8 bytes; share large content by mesh_put"]
    return []


def _check_refs(value: object) -> list[str]:
    if not isinstance(value, list):
        return ["refs: expected a list of strings"]
    problems = bool_problems(value, "refs")
    if len(value) > MAX_REFS:
        problems.append(f"refs: at most {MAX_REFS} entries")
    for i, ref in enumerate(value):
        if type(ref) is bool:
            continue
        if type(ref) is not str or not 1 <= len(ref) <= MAX_REF_CHARS:
            problems.append(f"refs[{i}]: expected a string of 1..{MAX_REF_CHARS} characters")
    return problems


def _check_participants(value: object) -> list[str]:
    if not isinstance(value, list):
        return ["participants: expected a list of 64 lowercase hex node ids"]
    problems = bool_problems(value, "participants")
    if len(value) > MAX_PARTICIPANTS:
        problems.append(f"participants: at most {MAX_PARTICIPANTS} entries")
    seen: set[str] = set()
    for i, node in enumerate(value):
        if type(node) is bool:
            continue
        if not is_node_hex(node):
            problems.append(f"participants[{i}]: expected a 64 lowercase hex node id")
        elif node in seen:
            problems.append(f"participants[{i}]: duplicate node id")
        else:
            seen.add(node)
    return problems


def _check_purpose(value: object) -> list[str]:
    if type(value) is not str:
        return ["purpose: expected a string"]
    if len(value) > MAX_PURPOSE_CHARS:
        return [f"purpose: longer than {MAX_PURPOSE_CHARS} characters"]
    return []


def _kind_rules(envelope: Mapping[object, object]) -> list[str]:
    """Rules that tie fields to ``kind``; they apply once ``kind`` itself is valid."""
    kind = envelope.get("kind")
    if type(kind) is not str or kind not in KINDS:
        return []
    problems: list[str] = []
    if "cipher" in envelope:
        return _sealed_rules(envelope)
    if (kind == KEY_KIND) != ("room_key" in envelope):
        problems.append(f"room_key: carried by {KEY_KIND} envelopes only, and always by them")
    if kind in REPLY_REQUIRED_KINDS and "in_reply_to" not in envelope:
        problems.append(f"in_reply_to: required for {kind}")
    text = envelope.get("text")
    if kind in TALK_KINDS and type(text) is str and not text.strip():
        problems.append(f"text: {kind} needs non-blank text")
    reply_to = envelope.get("in_reply_to")
    if reply_to is not None and reply_to == envelope.get("message_id"):
        problems.append("in_reply_to: a message cannot reply to itself")
    return problems


def _sealed_rules(envelope: Mapping[object, object]) -> list[str]:
    problems = [
        f"{key}: travels inside cipher in a sealed envelope"
        for key in SEALABLE[1:]
        if key in envelope
    ]
    if envelope.get("text") != "":
        problems.append("text: a sealed envelope's text is empty (it travels inside cipher)")
    if envelope.get("kind") == KEY_KIND or "room_key" in envelope:
        problems.append(f"cipher: a {KEY_KIND} envelope is not sealed")
    return problems


def _check_cipher(value: object) -> list[str]:
    """``{epoch, key_id, box}``: the room key's epoch and id, and base64 of nonce + secretbox."""
    if not isinstance(value, dict) or set(value) != {"epoch", "key_id", "box"}:
        return ["cipher: expected exactly {epoch, key_id, box}"]
    problems = bool_problems(value, "cipher")
    if not _is_epoch(value["epoch"]):
        problems.append(f"cipher.epoch: expected an integer 1..{MAX_EPOCH}")
    if not _matches(_HEX16, value["key_id"]):
        problems.append("cipher.key_id: expected 16 lowercase hex")
    box = value["box"]
    if not _matches(_BASE64, box) or len(box) > MAX_CIPHER_CHARS:
        problems.append(f"cipher.box: expected base64 of at most {MAX_CIPHER_CHARS} characters")
    return problems


def _check_room_key(value: object) -> list[str]:
    """``{epoch, key_id, salt, sealed: {node hex: base64}, signature}`` (see room_crypto)."""
    keys = {"epoch", "key_id", "salt", "sealed", "signature"}
    if not isinstance(value, dict) or set(value) != keys:
        return ["room_key: expected exactly {epoch, key_id, salt, sealed, signature}"]
    problems = bool_problems(value, "room_key")
    if not _is_epoch(value["epoch"]):
        problems.append(f"room_key.epoch: expected an integer 1..{MAX_EPOCH}")
    if not _matches(_HEX16, value["key_id"]):
        problems.append("room_key.key_id: expected 16 lowercase hex")
    if not _matches(_HEX32, value["salt"]):
        problems.append("room_key.salt: expected 32 lowercase hex")
    if not _matches(_SIG_HEX, value["signature"]):
        problems.append("room_key.signature: expected 128 lowercase hex")
    sealed = value["sealed"]
    if not isinstance(sealed, dict) or not 1 <= len(sealed) <= MAX_SEALED_KEYS:
        problems.append(f"room_key.sealed: expected 1..{MAX_SEALED_KEYS} node id: base64 pairs")
    else:
        for node, box in sealed.items():
            if not is_node_hex(node) or not _matches(_BASE64, box) or len(box) > 256:
                problems.append("room_key.sealed: expected 64 hex node ids mapped to base64")
                break
    return problems


def _is_epoch(value: object) -> bool:
    return type(value) is int and 1 <= value <= MAX_EPOCH


def _matches(pattern: re.Pattern[str], value: object) -> bool:
    return type(value) is str and pattern.fullmatch(value) is not None


_FIELD_CHECKS: Final[dict[str, _Check]] = {
    "message_id": _check_id("message_id"),
    "in_reply_to": _check_id("in_reply_to"),
    "room_topic": _check_room_topic,
    "sent_at": _check_sent_at,
    "from": _check_from,
    "kind": _check_kind,
    "text": _check_text,
    "refs": _check_refs,
    "participants": _check_participants,
    "purpose": _check_purpose,
    "cipher": _check_cipher,
    "room_key": _check_room_key,
}


# -- building and attestation -------------------------------------------------------------------


def build_envelope(
    *,
    message_id: str,
    room_topic: str,
    sender: bytes,
    kind: str,
    text: str,
    sent_at: int,
    in_reply_to: str | None = None,
    refs: Sequence[str] | None = None,
    participants: Sequence[bytes] | None = None,
    purpose: str | None = None,
) -> Envelope:
    """A valid envelope from its parts, or ``EnvelopeError`` listing every problem.

    ``sender`` and ``participants`` are raw 32-byte node ids; ``sent_at`` is the caller's clock
    in Unix ms; ``message_id`` usually comes from ``new_message_id(random16)``.
    """
    envelope: Envelope = {
        "message_id": message_id,
        "room_topic": room_topic,
        "sent_at": sent_at,
        "from": sender.hex() if isinstance(sender, bytes) else "",
        "kind": kind,
        "text": text,
    }
    if in_reply_to is not None:
        envelope["in_reply_to"] = in_reply_to
    if refs is not None:
        envelope["refs"] = list(refs)
    if participants is not None:
        envelope["participants"] = [
            node.hex() if isinstance(node, bytes) else "" for node in participants
        ]
    if purpose is not None:
        envelope["purpose"] = purpose
    problems = validate(envelope)
    if problems:
        raise EnvelopeError(problems)
    return envelope


def is_attested(envelope: object, publisher_node_id: bytes) -> bool:
    """True iff the station-attested publisher of the event is the envelope's ``from``.

    An envelope whose ``from`` is not its publisher is a claim nobody vouches for.
    """
    if not isinstance(envelope, Mapping) or type(publisher_node_id) is not bytes:
        return False
    sender = envelope.get("from")
    return (
        len(publisher_node_id) == 32 and is_node_hex(sender) and sender == publisher_node_id.hex()
    )


# -- threading ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ThreadedMessage:
    """One message placed in its thread. ``in_reply_to`` is kept as sent, even when the parent
    is unknown or the link was cut to break a cycle (then ``depth`` is 0)."""

    message: Mapping[str, object]
    message_id: str
    thread_root: str
    depth: int
    in_reply_to: str | None


def _sent_at(message: Mapping[str, object]) -> int:
    value = message.get("sent_at")
    return value if type(value) is int else 0


def thread(messages: Sequence[Mapping[str, object]]) -> list[ThreadedMessage]:
    """Thread ``messages`` by ``in_reply_to``, whatever order they arrived in.

    Output order: threads by their root's ``(sent_at, message_id)``; inside a thread depth-first,
    siblings by ``(sent_at, message_id)``, so a reply always follows its parent. A message
    without a string ``message_id`` is skipped; of several with one id the first is kept.
    Replies are linked across topics too: pass one room's messages to thread one room.
    """
    index: dict[str, Mapping[str, object]] = {}
    for message in messages:
        mid = message.get("message_id")
        if type(mid) is str and mid not in index:
            index[mid] = message

    def order(mid: str) -> tuple[int, str]:
        return (_sent_at(index[mid]), mid)

    parent = {mid: _known_parent(mid, message, index) for mid, message in index.items()}
    _cut_cycles(parent, order)
    roots, depths = _roots_and_depths(parent)

    children: dict[str, list[str]] = {}
    for mid in sorted(index, key=order):
        up = parent[mid]
        if up is not None:
            children.setdefault(up, []).append(mid)
    result: list[ThreadedMessage] = []
    stack = sorted((mid for mid, up in parent.items() if up is None), key=order, reverse=True)
    while stack:
        mid = stack.pop()
        message = index[mid]
        reply_to = message.get("in_reply_to")
        result.append(
            ThreadedMessage(
                message=message,
                message_id=mid,
                thread_root=roots[mid],
                depth=depths[mid],
                in_reply_to=reply_to if type(reply_to) is str else None,
            )
        )
        stack.extend(reversed(children.get(mid, [])))
    return result


def _known_parent(
    mid: str, message: Mapping[str, object], index: Mapping[str, object]
) -> str | None:
    reply_to = message.get("in_reply_to")
    if type(reply_to) is str and reply_to != mid and reply_to in index:
        return reply_to
    return None


def _cut_cycles(parent: dict[str, str | None], order: Callable[[str], tuple[int, str]]) -> None:
    """Make ``parent`` acyclic: in each cycle the earliest message loses its parent link."""
    on_path, done = 1, 2
    state: dict[str, int] = {}
    for start in sorted(parent, key=order):
        path: list[str] = []
        node: str | None = start
        while node is not None and node not in state:
            state[node] = on_path
            path.append(node)
            node = parent[node]
        if node is not None and state[node] == on_path:
            cycle = path[path.index(node) :]
            parent[min(cycle, key=order)] = None
        for visited in path:
            state[visited] = done


def _roots_and_depths(parent: Mapping[str, str | None]) -> tuple[dict[str, str], dict[str, int]]:
    """Root and depth of every node of an acyclic parent map, iteratively (deep chains are fine)."""
    roots: dict[str, str] = {}
    depths: dict[str, int] = {}
    for mid in parent:
        chain: list[str] = []
        node = mid
        while node not in roots:
            up = parent[node]
            if up is None:
                roots[node], depths[node] = node, 0
                break
            chain.append(node)
            node = up
        for child in reversed(chain):
            up = parent[child]
            assert up is not None
            roots[child], depths[child] = roots[up], depths[up] + 1
    return roots, depths


# -- waiting instead of polling -----------------------------------------------------------------


def poll_hint(messages: Sequence[Mapping[str, object]], me_hex: str) -> str | None:
    """A hint when ``me_hex`` spoke last on a topic and nobody has answered since, else None.

    Only talk kinds count as speaking (someone joining is not an answer). "Last" is the
    greatest ``sent_at``, ties broken by position in ``messages`` (later = later).
    """
    me = me_hex.lower()
    last: dict[str, tuple[int, int, object]] = {}
    for position, message in enumerate(messages):
        topic, kind = message.get("room_topic"), message.get("kind")
        if type(topic) is not str or type(kind) is not str or kind not in TALK_KINDS:
            continue
        key = (_sent_at(message), position, message.get("from"))
        if topic not in last or key[:2] > last[topic][:2]:
            last[topic] = key
    mine = sorted(topic for topic, (_, _, sender) in last.items() if sender == me)
    if not mine:
        return None
    return (
        f"you spoke last on {', '.join(mine)} and nothing new has arrived since: wait with "
        "mesh_wait_room (wait_seconds up to 3600) instead of polling, or let your harness's "
        "scheduler wake you for one read later"
    )
