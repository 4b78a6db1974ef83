"""The station's shared memory: agents deposit text, anyone recalls it by free-text query.

Invariants:
- ``MemoryService.handle`` never raises (cancellation aside): every call ends in an ``Outcome``.
  Refusals are raised inside as ``Refused`` and converted by ``relay.builtins.outcome.answer`` only;
  anything else is a bug or a disk error, logged with its traceback and answered 0x02 with no
  detail.
- Arguments are validated completely (``relay.builtins.arguments``), and the content chunked, before
any
  state is touched (the rate-limit buckets included). Malformed arguments are 0x0F
  ``bad_request: <what>``; oversize text is 0x0D ``payload_too_large``; a depositor over its
  rate is 0x08 ``rate_limited``; over its chunk cap, 0x0F ``quota_exceeded``. A deposit that
  would take the station past ``max_total_bytes`` is 0x0F ``quota_exceeded`` too (the station's
  memory is full); a query over the caller's query rate is 0x08 ``rate_limited``. Both details
  say what to do (the wait in ms; replace or shorten a document). Extra argument keys are
  ignored; a key whose value is null counts as absent.
- Chunks: at most ``MAX_CHUNK_CHARS``, balanced in size, cut at whitespace, preferably between
  paragraphs, else after a sentence (``chunk_text``). A cut never falls inside a word, so a
  single word longer than the limit stays whole. A chunk with fewer than ``MIN_INDEXED_NONSPACE``
  non-space characters is not stored; identical chunks of one deposit are stored once.
- A deposit replaces every earlier chunk of the same ``(depositor, document_id)`` in one
  ``BEGIN IMMEDIATE`` transaction, the chunk cap and the global byte cap checked inside it; a
  deposit that yields no chunk therefore empties its document. A deposit that does not grow
  what is held (chunks for the per-depositor cap, bytes for the global one) always passes.
  ``content_hash`` (``macula.services.house_client``, the one clients verify recalls with) is the
  hex
  SHA-256 of the chunk's UTF-8 text; ``document_id`` defaults to the hex SHA-256 of the whole
  content.
- ``usage`` holds the total chunks and stored bytes (UTF-8 of text + source_label + topics
  JSON, per chunk), kept by triggers on ``chunks``: the cap check never scans the table.
- Each depositor has one ``macula.rate.TokenBucket`` for deposits, each caller another for
  queries (``relay.house.buckets.TokenBuckets``, bounded in memory).
- User text never reaches FTS5 ``MATCH`` raw: the query is cut into words, each word quoted, the
  quoted words OR-ed. Results carry ints, floats, text and lists: never booleans.
- No clock and no randomness inside: ``now_ms`` is an argument.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import aiosqlite

from macula.services.house import MEMORY_ADD, MEMORY_QUERY
from macula.services.house_client import content_hash
from macula.services.limits import (
    DEFAULT_TOP_K,
    MAX_DOCUMENT_ID_CHARS,
    MAX_LABEL_CHARS,
    MAX_MEMORY_CONTENT_BYTES,
    MAX_QUERY_BYTES,
    MAX_TOP_K,
    MAX_TOPIC_CHARS,
    MAX_TOPICS,
)
from macula.store.base import Migration, Row, SqliteStore, check_node_id, execute, fetchall
from macula.wire.codes import ErrorCode
from relay.builtins.arguments import (
    Args,
    arguments,
    bad_request,
    caller_id,
    integer,
    kind,
    optional_text,
    required,
    text,
    too_large,
)
from relay.builtins.outcome import Handler, Outcome, Refused, dispatch
from relay.house.buckets import TokenBuckets

__all__ = [
    "DEFAULT_DEPOSIT_RATE",
    "DEFAULT_MAX_CHUNKS_PER_DEPOSITOR",
    "DEFAULT_MAX_TOTAL_BYTES",
    "DEFAULT_QUERY_RATE",
    "MAX_CHUNK_CHARS",
    "MIN_INDEXED_NONSPACE",
    "ChunkCapExceeded",
    "MemoryFull",
    "MemoryHit",
    "MemoryService",
    "MemoryStore",
    "chunk_text",
    "query_terms",
    "stored_bytes",
]

logger = logging.getLogger("macula.relay.house.memory")

MAX_CHUNK_CHARS: Final = 1000
MIN_INDEXED_NONSPACE: Final = 20
SLACK_CHARS: Final = 200  # how far a paragraph or sentence end may pull a cut from its aim
MAX_QUERY_TERMS: Final = 32
DEFAULT_MAX_TOTAL_BYTES: Final = 256 * 1024 * 1024
DEFAULT_MAX_CHUNKS_PER_DEPOSITOR: Final = 20_000
DEFAULT_DEPOSIT_RATE: Final = 5.0  # per second per depositor, burst 4x
DEFAULT_QUERY_RATE: Final = 10.0  # per second per caller, burst 4x
BM25_WEIGHTS: Final = (1.0, 1.0, 1.0)  # text, source_label, topics: depositor-chosen words count

# --- chunking (pure) --------------------------------------------------------------------------

_PARAGRAPH_BREAK: Final = re.compile(r"\n[^\S\n]*\n\s*")  # a blank line, spaces allowed on it
_WHITESPACE: Final = re.compile(r"\s+")
_SENTENCE_END: Final = frozenset(".!?;:")


@dataclass(frozen=True, slots=True)
class _Break:
    start: int  # where the whitespace run begins (a chunk ends here)
    end: int  # where it ends (the next chunk starts here)
    strength: int  # 2 between paragraphs, 1 after a sentence end or at a line break, else 0


def chunk_text(text: str) -> list[str]:
    """The indexable chunks of ``text``, in order (see the module invariants).

    Each cut aims at the size that splits what is left into equal parts of at most
    ``MAX_CHUNK_CHARS``, and moves up to ``SLACK_CHARS`` away from it to land between
    paragraphs, else after a sentence; failing both, at the whitespace nearest the aim.
    """
    normalized = text.replace("\r\n", "\n").replace("\r", "\n")
    paragraphs = (p.strip() for p in _PARAGRAPH_BREAK.split(normalized))
    joined = "\n\n".join(p for p in paragraphs if p)
    return [chunk for chunk in _split(joined) if _nonspace(chunk) >= MIN_INDEXED_NONSPACE]


def _split(text: str) -> list[str]:
    breaks = [_break(text, m) for m in _WHITESPACE.finditer(text) if m.start() > 0]
    starts = [b.start for b in breaks]
    pieces: list[str] = []
    begin = 0
    while len(text) - begin > MAX_CHUNK_CHARS:
        remaining = len(text) - begin
        aim = begin + remaining / math.ceil(remaining / MAX_CHUNK_CHARS)
        lo = bisect.bisect_right(starts, begin)
        hi = bisect.bisect_right(starts, begin + MAX_CHUNK_CHARS)
        if lo == hi:  # one word longer than the limit: keep it whole
            if lo == len(breaks):
                break
            cut = breaks[lo]
        else:
            cut = _best_cut(breaks[lo:hi], aim)
        pieces.append(text[begin : cut.start])
        begin = cut.end
    pieces.append(text[begin:])
    return pieces


def _break(text: str, match: re.Match[str]) -> _Break:
    gap = match.group()
    if gap.count("\n") >= 2:
        strength = 2
    elif "\n" in gap or text[match.start() - 1] in _SENTENCE_END:
        strength = 1
    else:
        strength = 0
    return _Break(match.start(), match.end(), strength)


def _best_cut(window: Sequence[_Break], aim: float) -> _Break:
    for strength in (2, 1):
        near = [b for b in window if b.strength >= strength and abs(b.start - aim) <= SLACK_CHARS]
        if near:
            return min(near, key=lambda b: abs(b.start - aim))
    return min(window, key=lambda b: abs(b.start - aim))


def _nonspace(text: str) -> int:
    return sum(1 for char in text if not char.isspace())


# --- queries (pure) ---------------------------------------------------------------------------

_WORD: Final = re.compile(r"[^\W_]+")
_STOPWORD_TEXT: Final = (
    "a about after all an and any are as at be before but by can could do does did for from has"
    " have how i if in into is it its me my no not of on or our should so than that the their"
    " them then there these they this to up was we what when where which who why will with would"
    " you your"
    " d ll m re s t ve"  # what is left of English contractions once the apostrophe splits them
)
_STOPWORDS: Final = frozenset(_STOPWORD_TEXT.split())


def query_terms(query_text: str) -> list[str]:
    """The distinct words of ``query_text`` worth matching; stopwords only when nothing else."""
    words = list(dict.fromkeys(match.group().casefold() for match in _WORD.finditer(query_text)))
    content = [word for word in words if word not in _STOPWORDS]
    return (content or words)[:MAX_QUERY_TERMS]


def _match_expression(terms: Sequence[str]) -> str:
    """An FTS5 expression matching any of ``terms``, each one a quoted string (never syntax)."""
    return " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)


# --- the store --------------------------------------------------------------------------------

_MEMORY_V1: Final[Migration] = (
    """
    CREATE TABLE chunks (
        id            INTEGER PRIMARY KEY,
        depositor     BLOB NOT NULL CHECK (length(depositor) = 32),
        document_id   TEXT NOT NULL,
        seq           INTEGER NOT NULL,   -- the chunk's position in its document
        text          TEXT NOT NULL,
        content_hash  TEXT NOT NULL,      -- hex SHA-256 of text's UTF-8
        source_label  TEXT NOT NULL,
        topics        TEXT NOT NULL,      -- JSON list of text
        created_ms    INTEGER NOT NULL
    )
    """,
    "CREATE INDEX chunks_by_document ON chunks (depositor, document_id)",
    """
    CREATE VIRTUAL TABLE chunks_fts USING fts5(
        text, source_label, topics, content = 'chunks', content_rowid = 'id',
        tokenize = 'porter unicode61 remove_diacritics 2'
    )
    """,
    """
    CREATE TRIGGER chunks_ai AFTER INSERT ON chunks BEGIN
        INSERT INTO chunks_fts (rowid, text, source_label, topics)
        VALUES (new.id, new.text, new.source_label, new.topics);
    END
    """,
    """
    CREATE TRIGGER chunks_ad AFTER DELETE ON chunks BEGIN
        INSERT INTO chunks_fts (chunks_fts, rowid, text, source_label, topics)
        VALUES ('delete', old.id, old.text, old.source_label, old.topics);
    END
    """,
    """
    CREATE TRIGGER chunks_au AFTER UPDATE ON chunks BEGIN
        INSERT INTO chunks_fts (chunks_fts, rowid, text, source_label, topics)
        VALUES ('delete', old.id, old.text, old.source_label, old.topics);
        INSERT INTO chunks_fts (rowid, text, source_label, topics)
        VALUES (new.id, new.text, new.source_label, new.topics);
    END
    """,
)

_SIZE: Final = (  # parenthesised: it is subtracted
    "(length(CAST({0}.text AS BLOB)) + length(CAST({0}.source_label AS BLOB))"
    " + length(CAST({0}.topics AS BLOB)))"
)

_MEMORY_V2: Final[Migration] = (
    """
    CREATE TABLE usage (
        id     INTEGER PRIMARY KEY CHECK (id = 0),
        chunks INTEGER NOT NULL,
        bytes  INTEGER NOT NULL
    )
    """,
    f"INSERT INTO usage SELECT 0, count(*), coalesce(sum({_SIZE.format('c')}), 0) FROM chunks c",
    f"""
    CREATE TRIGGER chunks_usage_ai AFTER INSERT ON chunks BEGIN
        UPDATE usage SET chunks = chunks + 1, bytes = bytes + {_SIZE.format("new")} WHERE id = 0;
    END
    """,
    f"""
    CREATE TRIGGER chunks_usage_ad AFTER DELETE ON chunks BEGIN
        UPDATE usage SET chunks = chunks - 1, bytes = bytes - {_SIZE.format("old")} WHERE id = 0;
    END
    """,
    f"""
    CREATE TRIGGER chunks_usage_au AFTER UPDATE ON chunks BEGIN
        UPDATE usage SET bytes = bytes - {_SIZE.format("old")} + {_SIZE.format("new")}
        WHERE id = 0;
    END
    """,
)

_DOCUMENT_USAGE: Final = f"""
SELECT count(*), coalesce(sum({_SIZE.format("c")}), 0) FROM chunks c
WHERE depositor = ? AND document_id = ?
"""

_INSERT: Final = """
INSERT INTO chunks (depositor, document_id, seq, text, content_hash, source_label, topics,
                    created_ms)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
"""

_SEARCH: Final = f"""
SELECT c.text, c.source_label, c.topics, c.document_id, c.depositor, c.content_hash,
       bm25(chunks_fts, {", ".join(map(str, BM25_WEIGHTS))}) AS rank
FROM chunks_fts JOIN chunks AS c ON c.id = chunks_fts.rowid
WHERE chunks_fts MATCH :expression
ORDER BY rank, c.id
LIMIT :limit
"""


class ChunkCapExceeded(Exception):
    """A deposit would leave its depositor holding more chunks than the cap allows."""

    def __init__(self, held: int, would_hold: int, cap: int) -> None:
        super().__init__(f"would hold {would_hold} chunks (holds {held}), cap {cap}")
        self.held = held
        self.would_hold = would_hold
        self.cap = cap


class MemoryFull(Exception):
    """A deposit would take the station's shared memory past its global byte cap."""

    def __init__(self, held: int, would_hold: int, cap: int) -> None:
        super().__init__(f"would hold {would_hold} bytes (holds {held}), cap {cap}")
        self.held = held
        self.would_hold = would_hold
        self.cap = cap


def stored_bytes(chunks: Sequence[str], source_label: str, topics_json: str) -> int:
    """What ``chunks`` take in ``usage.bytes`` (the ``_SIZE`` of each row, summed)."""
    overhead = len(source_label.encode("utf-8")) + len(topics_json.encode("utf-8"))
    return sum(len(chunk.encode("utf-8")) + overhead for chunk in chunks)


@dataclass(frozen=True, slots=True)
class MemoryHit:
    text: str
    source_label: str
    topics: list[str]
    document_id: str
    depositor: bytes
    content_hash: str
    score: float  # higher is better

    def to_wire(self) -> dict[str, object]:
        return {
            "text": self.text,
            "source_label": self.source_label,
            "topics": list(self.topics),
            "document_id": self.document_id,
            "depositor": self.depositor.hex(),
            "score": self.score,
            "content_hash": self.content_hash,
        }


class MemoryStore(SqliteStore):
    """Chunks of deposited text in SQLite, full-text indexed by FTS5 (porter + unicode61)."""

    MIGRATIONS = (_MEMORY_V1, _MEMORY_V2)

    async def replace_document(
        self,
        depositor: bytes,
        document_id: str,
        chunks: Sequence[str],
        *,
        source_label: str,
        topics: Sequence[str],
        now_ms: int,
        max_chunks: int,
        max_total_bytes: int | None = None,
    ) -> list[str]:
        """Make ``chunks`` the whole of ``(depositor, document_id)``; return their hashes.

        Raises ``ChunkCapExceeded`` (nothing changed) if the depositor would then hold more than
        ``max_chunks`` chunks, ``MemoryFull`` if the store would hold more than
        ``max_total_bytes`` (None: no cap) and the deposit grows it.
        """
        check_node_id(depositor, "depositor")
        hashes = [content_hash(chunk) for chunk in chunks]
        topics_json = json.dumps(list(topics), ensure_ascii=False)
        new_bytes = stored_bytes(chunks, source_label, topics_json)
        async with self._transaction() as db:
            held = await _count(db, "depositor = ?", (depositor,))
            row = (await fetchall(db, _DOCUMENT_USAGE, (depositor, document_id)))[0]
            old, old_bytes = int(row[0]), int(row[1])
            would_hold = held - old + len(chunks)
            if would_hold > max_chunks and len(chunks) > old:
                raise ChunkCapExceeded(held, would_hold, max_chunks)
            if max_total_bytes is not None and new_bytes > old_bytes:
                total = int((await fetchall(db, "SELECT bytes FROM usage"))[0][0])
                if total - old_bytes + new_bytes > max_total_bytes:
                    raise MemoryFull(total, total - old_bytes + new_bytes, max_total_bytes)
            await execute(
                db,
                "DELETE FROM chunks WHERE depositor = ? AND document_id = ?",
                (depositor, document_id),
            )
            for seq, (chunk, digest) in enumerate(zip(chunks, hashes, strict=True)):
                row = (depositor, document_id, seq, chunk, digest, source_label, topics_json)
                await execute(db, _INSERT, (*row, now_ms))
        return hashes

    async def search(self, terms: Sequence[str], limit: int) -> list[MemoryHit]:
        """Chunks matching any of ``terms`` (plain words, never FTS5 syntax), best first."""
        if not terms or limit <= 0:
            return []
        rows = await self._fetchall(
            _SEARCH, {"expression": _match_expression(terms), "limit": limit}
        )
        return [_hit(row) for row in rows]

    async def usage(self) -> tuple[int, int]:
        """``(chunks, stored bytes)`` held by the whole store (see ``stored_bytes``)."""
        row = await self._fetchone("SELECT chunks, bytes FROM usage")
        return (int(row[0]), int(row[1])) if row is not None else (0, 0)

    async def count(self, depositor: bytes | None = None, document_id: str | None = None) -> int:
        """Chunks held: all, one depositor's, or one document's (depositor and document_id)."""
        if depositor is None:
            row = await self._fetchone("SELECT count(*) FROM chunks")
        elif document_id is None:
            row = await self._fetchone(
                "SELECT count(*) FROM chunks WHERE depositor = ?", (depositor,)
            )
        else:
            row = await self._fetchone(
                "SELECT count(*) FROM chunks WHERE depositor = ? AND document_id = ?",
                (depositor, document_id),
            )
        return int(row[0]) if row is not None else 0


async def _count(db: aiosqlite.Connection, where: str, params: tuple[object, ...]) -> int:
    rows = await fetchall(db, f"SELECT count(*) FROM chunks WHERE {where}", params)
    return int(rows[0][0]) if rows else 0


def _hit(row: Row) -> MemoryHit:
    topics = json.loads(str(row[2]))
    return MemoryHit(
        text=str(row[0]),
        source_label=str(row[1]),
        topics=[str(topic) for topic in topics] if isinstance(topics, list) else [],
        document_id=str(row[3]),
        depositor=bytes(row[4]),
        content_hash=str(row[5]),
        score=0.0 - float(row[6]),  # bm25 is lower-is-better; 0.0 - x also avoids -0.0
    )


# --- argument checks (the shared ones are relay.builtins.arguments) -------------------------------


def _nonblank_text(args: Args, name: str, max_chars: int) -> str | None:
    value = optional_text(args, name, high=max_chars)
    if value is not None and not value.strip():
        raise bad_request(f"{name!r} must not be empty or blank")
    return value


def _topics(args: Args) -> list[str]:
    value = args.get("topics")
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_request(f"'topics' must be an array of text, got {kind(value)}")
    if len(value) > MAX_TOPICS:
        raise bad_request(f"'topics' has {len(value)} entries, limit {MAX_TOPICS}")
    topics: list[str] = []
    for index, item in enumerate(value):
        topic = text(item, f"topics[{index}]", high=MAX_TOPIC_CHARS)
        if not topic.strip():
            raise bad_request(f"'topics[{index}]' must not be empty or blank")
        if topic not in topics:
            topics.append(topic)
    return topics


def _sized_text(args: Args, name: str, limit: int, *, nul_ok: bool = False) -> str:
    value = text(required(args, name), name, nul_ok=nul_ok)
    size = len(value.encode("utf-8"))
    if size > limit:
        raise too_large(f"{name!r}", size, limit)
    return value


# --- the service ------------------------------------------------------------------------------


class MemoryService:
    """``macula.memory.add_knowledge_v1`` and ``macula.memory.query_v1`` over a ``MemoryStore``."""

    def __init__(
        self,
        store: MemoryStore,
        *,
        max_content_bytes: int = MAX_MEMORY_CONTENT_BYTES,
        max_chunks_per_depositor: int = DEFAULT_MAX_CHUNKS_PER_DEPOSITOR,
        max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
        rate: float = DEFAULT_DEPOSIT_RATE,
        burst: float = DEFAULT_DEPOSIT_RATE * 4,
        query_rate: float = DEFAULT_QUERY_RATE,
        query_burst: float = DEFAULT_QUERY_RATE * 4,
    ) -> None:
        if min(max_content_bytes, max_chunks_per_depositor, max_total_bytes) <= 0:
            raise ValueError(
                "max_content_bytes, max_chunks_per_depositor and max_total_bytes must be positive"
            )
        self.store = store
        self.max_content_bytes = max_content_bytes
        self.max_chunks_per_depositor = max_chunks_per_depositor
        self.max_total_bytes = max_total_bytes
        self.buckets = TokenBuckets(rate, burst)
        self.query_buckets = TokenBuckets(query_rate, query_burst)
        self._handlers: dict[str, Handler] = {
            MEMORY_ADD: self._add,
            MEMORY_QUERY: self._query,
        }

    async def handle(self, procedure: str, payload: object, caller: bytes, now_ms: int) -> Outcome:
        """Answer one call of ``procedure`` by ``caller``; 0x01 if it is not ours. Never raises."""
        return await dispatch(self._handlers, procedure, (payload, caller, now_ms), logger)

    async def _add(self, payload: object, caller: bytes, now_ms: int) -> object:
        args = arguments(payload)
        content = _sized_text(args, "content", self.max_content_bytes)
        if not content:
            raise bad_request("'content' must not be empty")
        source_label = _nonblank_text(args, "source_label", MAX_LABEL_CHARS) or ""
        topics = _topics(args)
        document_id = _nonblank_text(args, "document_id", MAX_DOCUMENT_ID_CHARS)
        depositor = caller_id(caller, "bad_request")
        chunks = list(dict.fromkeys(chunk_text(content)))  # identical chunks stored once
        self.buckets.take_or_refuse(depositor, now_ms, "deposits")
        document_id = document_id or content_hash(content)
        try:
            hashes = await self.store.replace_document(
                depositor,
                document_id,
                chunks,
                source_label=source_label,
                topics=topics,
                now_ms=now_ms,
                max_chunks=self.max_chunks_per_depositor,
                max_total_bytes=self.max_total_bytes,
            )
        except MemoryFull as exc:
            raise Refused(
                ErrorCode.UNKNOWN_ERROR,
                "quota_exceeded",
                f"the station's shared memory is full ({exc.held} of {exc.cap} bytes held;"
                f" this deposit needs {exc.would_hold - exc.held} more): shorten it, replace"
                " one of your documents with a shorter one, or deposit on another station",
            ) from None
        except ChunkCapExceeded as exc:
            raise Refused(
                ErrorCode.UNKNOWN_ERROR,
                "quota_exceeded",
                f"this deposit would leave this node holding {exc.would_hold} chunks"
                f" (it holds {exc.held}); the limit is {exc.cap}",
            ) from None
        return {"chunks": len(hashes), "document_id": document_id, "content_hashes": hashes}

    async def _query(self, payload: object, caller: bytes, now_ms: int) -> object:
        args = arguments(payload)
        query_text = _sized_text(args, "query_text", MAX_QUERY_BYTES, nul_ok=True)  # never stored
        top_k = integer(args, "top_k", 1, MAX_TOP_K, default=DEFAULT_TOP_K)
        asker = caller_id(caller, "bad_request")
        self.query_buckets.take_or_refuse(asker, now_ms, "queries")
        terms = query_terms(query_text)
        if not terms:
            return {"hits": []}
        hits = await self.store.search(terms, top_k)
        return {"hits": [hit.to_wire() for hit in hits]}
