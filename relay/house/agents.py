"""The agent directory: which agents chose to be listed (``macula.agents.*_v1``), and its store.

Invariants:
- ``handle`` never raises (cancellation aside): every call ends in an ``Outcome``, through
  ``relay.builtins.outcome.answer``. Refusals are 0x0F ``<reason>: <text>`` with reason
  ``bad_request``,
  ``unauthorized``, ``directory_full`` or ``unknown_procedure``, and 0x0A ``puzzle_required``;
  anything else is a bug or a disk error, logged with its traceback and answered 0x02.
- Arguments are validated completely (``relay.builtins.arguments``) before any state is touched. A
null
  argument, and a null optional key, count as absent; extra keys are ignored. Results carry no
  booleans.
- Registration needs an identity that meets the S/Kademlia puzzle (``puzzle_valid``) at
  ``puzzle_difficulty`` (default ``DEFAULT_PUZZLE_DIFFICULTY``, what every macula identity is
  ground to; 0 turns it off): each directory entry costs its holder 2^difficulty key
  generations, so free identities cannot fill the directory. Refused 0x0A ``puzzle_required``,
  checked before any proof or store work.
- Only the key holder writes an agent entry: ``entry.node_id`` must be the authenticated caller,
  and the payload must carry that key's proof bound to ``<procedure>#<node hex>`` within
  ``PROOF_SKEW_MS`` of ``now_ms``. A replay is only useful to the key holder itself.
- Expired agent entries are never listed. ``list`` only reads (no write per call); ``register``
  deletes expired rows (indexed by expiry, at most the table) and ``prune`` on demand. A new
  node beyond ``max_agents`` live entries is refused ``directory_full``; a renewal always
  passes.
- A registration may carry ``listing_proof`` (``macula.services.directory_listing``): the agent's
proof
  bound to this station (``station_id``), the ttl and the entry. It must verify (within
  ``PROOF_SKEW_MS``) or the registration is refused ``unauthorized``; it is stored and listed
  with the row, so that other stations can check the row when this one relays it. Without it
  (or with no ``station_id``) the row is listed here only.
No clock: ``now_ms`` is an argument.
"""

from __future__ import annotations

import builtins
import json
import logging
from dataclasses import dataclass
from typing import Final

from macula.agent.envelope import is_node_hex
from macula.agent.petnames import petname
from macula.agent.proof import verify_proof
from macula.services.directory_listing import listing_procedure
from macula.services.house import AGENTS_LIST, AGENTS_REGISTER, AGENTS_REMOVE
from macula.services.limits import DEFAULT_AGENTS_LIST, MAX_AGENT_TEXT_CHARS, MAX_AGENTS_LIST
from macula.store.base import (
    Migration,
    Row,
    SqliteStore,
    check_limit,
    check_node_id,
    execute,
    fetchall,
    opt_text,
)
from macula.wire.codes import ErrorCode
from macula.wire.identity import DEFAULT_PUZZLE_DIFFICULTY, puzzle_valid
from relay.builtins.arguments import (
    Args,
    bad_request,
    caller_id,
    handler_for,
    integer,
    kind,
    optional_map,
    optional_text,
    refusal,
    required,
    text,
)
from relay.builtins.outcome import Handler, Outcome, Refused, answer

__all__ = [
    "MAX_AGENTS",
    "AgentDirectory",
    "AgentDirectoryStore",
    "AgentEntry",
    "AgentRegistration",
    "key_holder_procedure",
]

logger = logging.getLogger("macula.relay.house")


PROOF_SKEW_MS: Final = 60_000
MAX_OFFERS: Final = 32
MAX_AGENTS: Final = 10_000
MIN_TTL_S: Final = 60
DEFAULT_TTL_S: Final = 1200
MAX_TTL_S: Final = 3600


# --- the store --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentEntry:
    """What an agent asked to be listed with; the handler has checked every field."""

    node_id: bytes
    petname: str
    operator_name: str | None = None
    session_name: str | None = None
    model: str | None = None
    connected_via: str | None = None
    offers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AgentRegistration:
    entry: AgentEntry
    registered_ms: int
    expires_ms: int
    listing_proof: dict[str, object] | None = None


_AGENTS_V1: Final[Migration] = (
    """
    CREATE TABLE agents (
        node_id       BLOB PRIMARY KEY CHECK (length(node_id) = 32),
        petname       TEXT NOT NULL,
        operator_name TEXT,
        session_name  TEXT,
        model         TEXT,
        connected_via TEXT,
        offers        TEXT NOT NULL,   -- a JSON array of text
        registered_ms INTEGER NOT NULL,
        expires_ms    INTEGER NOT NULL
    ) WITHOUT ROWID
    """,
    "CREATE INDEX agents_by_expiry ON agents (expires_ms)",
    "CREATE INDEX agents_by_registered ON agents (registered_ms)",
)
_AGENTS_V2: Final[Migration] = ("ALTER TABLE agents ADD COLUMN listing_proof TEXT",)

_COLUMNS: Final = (
    "node_id, petname, operator_name, session_name, model, connected_via, offers,"
    " registered_ms, expires_ms, listing_proof"
)

_UPSERT: Final = f"""
INSERT OR REPLACE INTO agents ({_COLUMNS})
VALUES (:node_id, :petname, :operator_name, :session_name, :model, :connected_via, :offers,
        :registered_ms, :expires_ms, :listing_proof)
"""

_COUNT_AND_PRESENT: Final = (
    "SELECT (SELECT count(*) FROM agents), EXISTS (SELECT 1 FROM agents WHERE node_id = ?)"
)


class AgentDirectoryStore(SqliteStore):
    """Agent entries keyed by node id, each with an expiry; most recently registered first."""

    MIGRATIONS = (_AGENTS_V1, _AGENTS_V2)

    async def register(
        self,
        entry: AgentEntry,
        now_ms: int,
        expires_ms: int,
        max_entries: int = MAX_AGENTS,
        listing_proof: dict[str, object] | None = None,
    ) -> bool:
        """Store or renew ``entry`` (with its ``listing_proof``) until ``expires_ms``; False
        (nothing stored) if the node is new and ``max_entries`` live entries are already held.
        Expired entries go first."""
        check_node_id(entry.node_id)
        params = {
            "node_id": entry.node_id,
            "petname": entry.petname,
            "operator_name": entry.operator_name,
            "session_name": entry.session_name,
            "model": entry.model,
            "connected_via": entry.connected_via,
            "offers": json.dumps(list(entry.offers), ensure_ascii=False),
            "registered_ms": now_ms,
            "expires_ms": expires_ms,
            "listing_proof": None if listing_proof is None else json.dumps(listing_proof),
        }
        async with self._transaction() as db:
            await execute(db, "DELETE FROM agents WHERE expires_ms <= ?", (now_ms,))
            held, present = (await fetchall(db, _COUNT_AND_PRESENT, (entry.node_id,)))[0]
            if not present and int(held) >= max_entries:
                return False
            await execute(db, _UPSERT, params)
            return True

    async def remove(self, node_id: bytes) -> bool:
        """Forget ``node_id``; True if it was held (expired or not)."""
        check_node_id(node_id)
        return await self._execute("DELETE FROM agents WHERE node_id = ?", (node_id,)) > 0

    async def list(
        self, now_ms: int, limit: int = DEFAULT_AGENTS_LIST
    ) -> builtins.list[AgentRegistration]:
        """Unexpired entries, most recently registered first (ties by node id)."""
        check_limit(limit)
        rows = await self._fetchall(
            f"SELECT {_COLUMNS} FROM agents WHERE expires_ms > ?"
            " ORDER BY registered_ms DESC, node_id LIMIT ?",
            (now_ms, limit),
        )
        return [_registration(row) for row in rows]

    async def listed(
        self, node_ids: builtins.list[bytes], now_ms: int
    ) -> dict[bytes, AgentRegistration]:
        """The unexpired entries of ``node_ids`` (at most ``MAX_AGENTS_LIST`` asked at once)."""
        if not node_ids:
            return {}
        if len(node_ids) > MAX_AGENTS_LIST:
            raise ValueError(f"at most {MAX_AGENTS_LIST} node ids at once")
        marks = ",".join("?" * len(node_ids))
        rows = await self._fetchall(
            f"SELECT {_COLUMNS} FROM agents WHERE node_id IN ({marks}) AND expires_ms > ?",
            (*node_ids, now_ms),
        )
        return {bytes(row[0]): _registration(row) for row in rows}

    async def prune(self, now_ms: int) -> int:
        """Delete the entries expired at ``now_ms``; return how many."""
        return await self._execute("DELETE FROM agents WHERE expires_ms <= ?", (now_ms,))

    async def count(self) -> int:
        """Rows held, including expired ones not yet pruned."""
        row = await self._fetchone("SELECT count(*) FROM agents")
        return int(row[0]) if row is not None else 0


def _registration(row: Row) -> AgentRegistration:
    offers = json.loads(row[6])
    entry = AgentEntry(
        node_id=bytes(row[0]),
        petname=str(row[1]),
        operator_name=opt_text(row[2]),
        session_name=opt_text(row[3]),
        model=opt_text(row[4]),
        connected_via=opt_text(row[5]),
        offers=tuple(str(offer) for offer in offers) if isinstance(offers, list) else (),
    )
    proof = json.loads(row[9]) if row[9] is not None else None
    return AgentRegistration(
        entry,
        registered_ms=int(row[7]),
        expires_ms=int(row[8]),
        listing_proof=proof if isinstance(proof, dict) else None,
    )


# --- the procedures ---------------------------------------------------------------------------


def key_holder_procedure(procedure: str, node_id: bytes) -> str:
    """What a register/remove proof is bound to: ``<procedure>#<64 hex node id>``."""
    return f"{procedure}#{node_id.hex()}"


def _node_hex(args: Args, name: str, label: str) -> str:
    value = required(args, name, label)
    if not is_node_hex(value):
        raise bad_request(f"{label!r} must be a node id in 64 lowercase hex, got {kind(value)}")
    assert isinstance(value, str)
    return value


def _text(args: Args, name: str, label: str) -> str | None:
    return optional_text(args, name, high=MAX_AGENT_TEXT_CHARS, label=label, nul_ok=True)


def _check_key_holder(
    args: Args, procedure: str, node_hex: str, caller: bytes, now_ms: int
) -> None:
    """The caller is ``node_hex`` and proved it for ``procedure``, else ``unauthorized``."""
    if node_hex != caller.hex():
        raise refusal("unauthorized", "only the holder of a node id's key may write its entry")
    bound = key_holder_procedure(procedure, caller)
    problem = verify_proof(args["proof"], caller, bound, now_ms, PROOF_SKEW_MS)
    if problem is not None:
        raise refusal(
            "unauthorized",
            f"proof {problem}: sign {bound!r} with the caller's key within 60 s of now",
        )


def _offers(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or len(value) > MAX_OFFERS:
        raise bad_request(f"'entry.offers' must be an array of at most {MAX_OFFERS} texts")
    return tuple(
        text(offer, f"entry.offers[{index}]", low=1, high=MAX_AGENT_TEXT_CHARS, nul_ok=True)
        for index, offer in enumerate(value)
    )


def _agent_entry(value: object) -> AgentEntry:
    args = optional_map(value, "'entry'")
    node_hex = _node_hex(args, "node_id", "entry.node_id")
    node_id = bytes.fromhex(node_hex)
    expected = petname(node_id)
    if args.get("petname") != expected:
        got = kind(args.get("petname"))
        raise bad_request(f"'entry.petname' must be {expected!r}, the node id's petname; got {got}")
    return AgentEntry(
        node_id=node_id,
        petname=expected,
        operator_name=_text(args, "operator_name", "entry.operator_name"),
        session_name=_text(args, "session_name", "entry.session_name"),
        model=_text(args, "model", "entry.model"),
        connected_via=_text(args, "connected_via", "entry.connected_via"),
        offers=_offers(args.get("offers")),
    )


def entry_fields(entry: AgentEntry) -> dict[str, object]:
    """The entry as a listing proof's digest sees it (``macula.services.directory_listing``)."""
    return {
        "node_id": entry.node_id.hex(),
        "petname": entry.petname,
        "operator_name": entry.operator_name,
        "session_name": entry.session_name,
        "model": entry.model,
        "connected_via": entry.connected_via,
        "offers": list(entry.offers),
    }


def _agent_view(registration: AgentRegistration) -> dict[str, object]:
    entry = registration.entry
    view: dict[str, object] = {
        "node_id": entry.node_id.hex(),
        "petname": entry.petname,
        "operator_name": entry.operator_name,
        "session_name": entry.session_name,
        "model": entry.model,
        "connected_via": entry.connected_via,
        "offers": list(entry.offers),
        "registered_ms": registration.registered_ms,
        "expires_ms": registration.expires_ms,
    }
    if registration.listing_proof is not None:
        view["listing_proof"] = registration.listing_proof
    return view


class AgentDirectory:
    """``macula.agents.register_v1``, ``remove_v1`` and ``list_v1`` over a store."""

    def __init__(
        self,
        store: AgentDirectoryStore,
        *,
        max_agents: int = MAX_AGENTS,
        puzzle_difficulty: int = DEFAULT_PUZZLE_DIFFICULTY,
        station_id: bytes | None = None,
    ) -> None:
        if type(max_agents) is not int or max_agents < 1:
            raise ValueError("max_agents must be a positive int")
        if type(puzzle_difficulty) is not int or not 0 <= puzzle_difficulty <= 64:
            raise ValueError("puzzle_difficulty must be an int in 0..64")
        self.store = store
        self.max_agents = max_agents
        self.puzzle_difficulty = puzzle_difficulty
        self.station_id = station_id
        self._handlers: dict[str, Handler] = {
            AGENTS_REGISTER: self._register,
            AGENTS_REMOVE: self._remove,
            AGENTS_LIST: self._list,
        }

    async def handle(self, procedure: str, payload: object, caller: bytes, now_ms: int) -> Outcome:
        """Answer one call of ``procedure`` from ``caller`` (its node id). Never raises."""
        return await answer(
            procedure,
            lambda: handler_for(self._handlers, procedure)(payload, caller, now_ms),
            logger,
        )

    async def prune(self, now_ms: int) -> int:
        """Delete the entries expired at ``now_ms``; return how many."""
        return await self.store.prune(now_ms)

    async def _register(self, payload: object, caller: bytes, now_ms: int) -> object:
        args = optional_map(payload)
        entry = _agent_entry(required(args, "entry"))
        ttl_s = integer(args, "ttl_seconds", MIN_TTL_S, MAX_TTL_S, default=DEFAULT_TTL_S)
        required(args, "proof")
        caller = caller_id(caller, "unauthorized")
        if not puzzle_valid(caller, self.puzzle_difficulty):
            raise Refused(
                ErrorCode.CRYPTO_PUZZLE_INVALID,
                "puzzle_required",
                f"this directory lists only identities meeting the S/Kademlia puzzle at"
                f" difficulty {self.puzzle_difficulty}; create one with"
                f" Identity.generate(os.urandom, difficulty={self.puzzle_difficulty})",
            )
        _check_key_holder(args, AGENTS_REGISTER, entry.node_id.hex(), caller, now_ms)
        listing_proof = self._listing_proof(args.get("listing_proof"), entry, ttl_s, now_ms)
        expires_ms = now_ms + ttl_s * 1000
        stored = await self.store.register(
            entry, now_ms, expires_ms, self.max_agents, listing_proof
        )
        if not stored:
            raise refusal(
                "directory_full",
                f"the directory holds {self.max_agents} agents; try again later",
            )
        return {"registered": 1, "expires_ms": expires_ms}

    def _listing_proof(
        self, proof: object, entry: AgentEntry, ttl_s: int, now_ms: int
    ) -> dict[str, object] | None:
        """The registration's checked ``listing_proof`` to store, or None if there is none."""
        if proof is None or self.station_id is None:
            return None
        bound = listing_procedure(self.station_id, ttl_s, entry_fields(entry))
        problem = verify_proof(proof, entry.node_id, bound, now_ms, PROOF_SKEW_MS)
        if problem is not None:
            raise refusal(
                "unauthorized",
                f"listing_proof {problem}: sign {bound!r} (this station, the ttl and the"
                " entry's digest) with the caller's key within 60 s of now, or leave it out",
            )
        assert isinstance(proof, dict)
        return dict(proof)

    async def _remove(self, payload: object, caller: bytes, now_ms: int) -> object:
        args = optional_map(payload)
        node_hex = _node_hex(args, "node_id", "node_id")
        required(args, "proof")
        caller = caller_id(caller, "unauthorized")
        _check_key_holder(args, AGENTS_REMOVE, node_hex, caller, now_ms)
        return {"removed": int(await self.store.remove(caller))}

    async def _list(self, payload: object, caller: bytes, now_ms: int) -> object:
        args = optional_map(payload)
        limit = integer(args, "limit", 1, MAX_AGENTS_LIST, default=DEFAULT_AGENTS_LIST)
        agents = [
            _agent_view(registration) for registration in await self.store.list(now_ms, limit)
        ]
        return {"count": len(agents), "agents": agents}
