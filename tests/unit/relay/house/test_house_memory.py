"""The station's shared memory (relay.house.memory): chunking, deposits, recall, limits.

Real SQLite files under ``tmp_path``; coroutines run with ``asyncio.run`` (no pytest-asyncio).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import stat
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from macula.services.house import MEMORY_ADD, MEMORY_QUERY
from macula.wire.codes import ErrorCode
from relay.builtins.outcome import Outcome
from relay.house.buckets import TokenBuckets
from relay.house.memory import (
    MAX_CHUNK_CHARS,
    MIN_INDEXED_NONSPACE,
    MemoryService,
    MemoryStore,
    chunk_text,
    query_terms,
)
from support.paths import SCRIPTS
from support.running import run

T = TypeVar("T")

ALICE = bytes(range(1, 33))
BOB = bytes(range(33, 65))
NOW = 1_767_225_600_000
BAD = ErrorCode.UNKNOWN_ERROR

TLS = (
    "Rotating TLS certificates without downtime: issue the new certificate while the old one is"
    " still valid, deploy both, switch the listener to the new key pair, then retire the old one"
    " after every client has reconnected."
)
SOURDOUGH = (
    "Feeding a sourdough starter: discard half, add equal weights of flour and water, and keep"
    " it somewhere warm until it doubles. A starter fed twice a day stays lively."
)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def with_service(path: Path, body: Callable[[MemoryService], Awaitable[T]], **limits: Any) -> T:
    async def go() -> T:
        async with await MemoryStore.open(path) as store:
            return await body(MemoryService(store, **limits))

    return asyncio.run(go())


async def add(
    service: MemoryService, content: str, caller: bytes = ALICE, now: int = NOW, **fields: Any
) -> Outcome:
    return await service.handle(MEMORY_ADD, {"content": content, **fields}, caller, now)


async def query(service: MemoryService, text: str, top_k: object = None) -> Outcome:
    payload: dict[str, Any] = {"query_text": text}
    if top_k is not None:
        payload["top_k"] = top_k
    return await service.handle(MEMORY_QUERY, payload, BOB, NOW)


def hits(outcome: Outcome) -> list[dict[str, Any]]:
    assert not outcome.is_error, (outcome.code, outcome.detail)
    assert isinstance(outcome.payload, dict)
    found = outcome.payload["hits"]
    assert isinstance(found, list)
    return found


def refused(outcome: Outcome, code: int, reason: str, *words: str) -> str:
    assert outcome.code == code, (outcome.code, outcome.detail, outcome.payload)
    assert outcome.detail is not None
    detail = outcome.detail.decode()
    assert detail.startswith(f"{reason}: "), detail
    for word in words:
        assert word in detail, (word, detail)
    return detail


def has_bool(value: object) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, dict):
        return any(has_bool(k) or has_bool(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_bool(item) for item in value)
    return False


WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda")


def sentences(count: int, seed: int = 0) -> str:
    words = WORDS
    out = []
    for i in range(count):
        n = 6 + (i * 7 + seed) % 9
        out.append(" ".join(words[(i * 5 + j * 3 + seed) % len(words)] for j in range(n)) + ".")
    return " ".join(out).capitalize()


# --- chunking ---------------------------------------------------------------------------------


def test_short_text_is_one_chunk_and_tiny_text_none() -> None:
    assert chunk_text(f"  {TLS}\n\n") == [TLS]
    assert chunk_text("ok thanks") == []
    assert chunk_text("a b c d e f g h i j k l m n o p q r s") == []  # 19 non-space characters
    assert chunk_text("a b c d e f g h i j k l m n o p q r s t") != []  # 20
    assert chunk_text(" \n\n \t ") == []
    assert MIN_INDEXED_NONSPACE == 20


def test_chunks_are_bounded_balanced_and_never_split_words() -> None:
    text = "\n\n".join(sentences(n, seed) for seed, n in enumerate((3, 40, 2, 12, 12, 1, 25)))
    chunks = chunk_text(text)
    assert len(chunks) > 3
    assert all(len(chunk) <= MAX_CHUNK_CHARS for chunk in chunks)
    assert all(len(chunk) >= 400 for chunk in chunks), [len(c) for c in chunks]
    assert " ".join(chunks).split() == text.split()  # every word whole, in order, none lost


def test_cuts_prefer_paragraph_then_sentence_boundaries() -> None:
    paragraphs = [sentences(3, seed) for seed in range(12)]  # ~150-250 characters each
    chunks = chunk_text("\n\n".join(paragraphs))
    assert len(chunks) > 1
    for chunk in chunks:
        assert chunk.split("\n\n")[0] in paragraphs and chunk.split("\n\n")[-1] in paragraphs
    long_paragraph = sentences(60)
    for chunk in chunk_text(long_paragraph):
        assert chunk.endswith("."), chunk[-40:]


def test_packs_small_paragraphs_and_keeps_a_giant_word_whole() -> None:
    chunks = chunk_text("Setup\n\n" + TLS + "\n\n" + SOURDOUGH)
    assert chunks == ["Setup\n\n" + TLS + "\n\n" + SOURDOUGH]
    giant = "x" * (MAX_CHUNK_CHARS * 2)
    chunks = chunk_text(f"{giant} and then a few ordinary words after it")
    assert chunks[0] == giant
    assert chunks[1:] == ["and then a few ordinary words after it"]


def test_line_endings_are_normalised() -> None:
    assert chunk_text(f"{TLS}\r\n\r\n{SOURDOUGH}") == chunk_text(f"{TLS}\n\n{SOURDOUGH}")


def test_query_terms_are_plain_words() -> None:
    terms = query_terms('"foo" OR NEAR( bar* -baz col:umn ^x')
    assert terms == ["foo", "near", "bar", "baz", "col", "umn", "x"]
    assert all(re.fullmatch(r"[^\W_]+", term) for term in terms)
    assert query_terms("How do I rotate the TLS certs?") == ["rotate", "tls", "certs"]
    assert query_terms("how to") == ["how", "to"]  # only stopwords: keep them
    assert query_terms(" *-:()\"' ") == []


# --- deposits and recall ----------------------------------------------------------------------


def test_add_then_query_finds_it_with_every_field(tmp_path: Path) -> None:
    async def body(service: MemoryService) -> None:
        added = await add(service, TLS, source_label="ops handbook", topics=["tls", "ops"])
        assert not added.is_error, added.detail
        document_id = sha256(TLS)  # no document_id given: the content's hash
        assert added.payload == {
            "chunks": 1,
            "document_id": document_id,
            "content_hashes": [sha256(TLS)],
        }
        await add(service, SOURDOUGH, source_label="kitchen")
        outcome = await query(service, "how do I rotate a certificate?")
        found = hits(outcome)
        assert len(found) == 1
        hit = found[0]
        assert hit == {
            "text": TLS,
            "source_label": "ops handbook",
            "topics": ["tls", "ops"],
            "document_id": document_id,
            "depositor": ALICE.hex(),
            "score": hit["score"],
            "content_hash": sha256(TLS),
        }
        assert hashlib.sha256(hit["text"].encode()).hexdigest() == hit["content_hash"]
        assert type(hit["score"]) is float and hit["score"] > 0
        assert not has_bool(outcome.payload) and not has_bool(added.payload)
        assert hits(await query(service, "zeppelin")) == []

    with_service(tmp_path / "memory.sqlite3", body)


def test_better_matches_score_higher(tmp_path: Path) -> None:
    async def body(service: MemoryService) -> None:
        await add(service, "The certificate expired. " + SOURDOUGH)
        await add(service, TLS)
        found = hits(await query(service, "rotate TLS certificates"))
        assert found[0]["text"] == TLS
        assert found[0]["score"] > found[1]["score"]

    with_service(tmp_path / "memory.sqlite3", body)


def test_readding_a_document_replaces_its_chunks(tmp_path: Path) -> None:
    async def body(service: MemoryService) -> None:
        long_text = "\n\n".join(sentences(8, seed) + " zebra" for seed in range(6))
        first = await add(service, long_text, document_id="notes")
        assert isinstance(first.payload, dict) and first.payload["chunks"] > 1
        assert await service.store.count(ALICE, "notes") == first.payload["chunks"]
        second = await add(service, TLS, document_id="notes")
        assert second.payload == {
            "chunks": 1,
            "document_id": "notes",
            "content_hashes": [sha256(TLS)],
        }
        assert hits(await query(service, "zebra")) == []
        assert [hit["text"] for hit in hits(await query(service, "certificates"))] == [TLS]
        assert await service.store.count(ALICE, "notes") == 1
        assert await service.store.count() == 1

    with_service(tmp_path / "memory.sqlite3", body)


def test_another_depositors_document_is_independent(tmp_path: Path) -> None:
    async def body(service: MemoryService) -> None:
        await add(service, TLS, ALICE, document_id="howto")
        await add(service, SOURDOUGH, BOB, document_id="howto")
        assert await service.store.count(ALICE, "howto") == 1
        assert await service.store.count(BOB, "howto") == 1
        (tls,) = hits(await query(service, "certificates"))
        (bread,) = hits(await query(service, "sourdough"))
        assert (tls["depositor"], bread["depositor"]) == (ALICE.hex(), BOB.hex())
        await add(service, SOURDOUGH + " Bake at 250 degrees.", BOB, document_id="howto")
        assert hits(await query(service, "certificates"))[0]["text"] == TLS

    with_service(tmp_path / "memory.sqlite3", body)


def test_content_without_an_indexable_chunk_answers_zero(tmp_path: Path) -> None:
    async def body(service: MemoryService) -> None:
        outcome = await add(service, "  ok!  ")
        assert outcome.payload == {
            "chunks": 0,
            "document_id": sha256("  ok!  "),
            "content_hashes": [],
        }
        await add(service, TLS, document_id="doc")
        emptied = await add(service, "-", document_id="doc")
        assert isinstance(emptied.payload, dict) and emptied.payload["chunks"] == 0
        assert await service.store.count() == 0  # the document now holds nothing

    with_service(tmp_path / "memory.sqlite3", body)


def test_identical_chunks_of_one_deposit_are_stored_once(tmp_path: Path) -> None:
    async def body(service: MemoryService) -> None:
        outcome = await add(service, "\n\n".join([sentences(6)] * 6))
        assert isinstance(outcome.payload, dict)
        hashes = outcome.payload["content_hashes"]
        assert len(hashes) == len(set(hashes)) == outcome.payload["chunks"]

    with_service(tmp_path / "memory.sqlite3", body)


# --- limits -----------------------------------------------------------------------------------


def test_top_k_bounds(tmp_path: Path) -> None:
    async def body(service: MemoryService) -> None:
        for i in range(15):
            await add(service, f"Note {i}: the quarterly certificate audit found {i} problems.")
        for bad in (0, 101, -1, True, 2.5, "5"):
            refused(await query(service, "certificate", bad), BAD, "bad_request", "top_k")
        assert len(hits(await query(service, "certificate"))) == 10  # the default
        assert len(hits(await query(service, "certificate", 3))) == 3
        assert len(hits(await query(service, "certificate", 1))) == 1
        assert len(hits(await query(service, "certificate", 100))) == 15

    with_service(tmp_path / "memory.sqlite3", body)


def test_oversize_content_and_query_are_refused(tmp_path: Path) -> None:
    async def body(service: MemoryService) -> None:
        refused(await add(service, "é" * 600), ErrorCode.PAYLOAD_TOO_LARGE, "payload_too_large")
        assert not (await add(service, "é" * 500)).is_error  # 1000 bytes: at the limit
        detail = refused(
            await query(service, "word " * 1000), ErrorCode.PAYLOAD_TOO_LARGE, "payload_too_large"
        )
        assert "query_text" in detail

    with_service(tmp_path / "memory.sqlite3", body, max_content_bytes=1000)


def test_rate_limit_refuses_then_recovers(tmp_path: Path) -> None:
    async def body(service: MemoryService) -> None:
        for i in range(3):
            assert not (await add(service, f"{TLS} {i}", now=NOW)).is_error
        refused(
            await add(service, TLS, now=NOW + 10), ErrorCode.UPSTREAM_CONGESTION, "rate_limited"
        )
        assert not (await add(service, SOURDOUGH, BOB, now=NOW + 10)).is_error  # per depositor
        assert not (await add(service, TLS, now=NOW + 510)).is_error  # half a second: 1 token
        refused(
            await add(service, TLS, now=NOW + 520), ErrorCode.UPSTREAM_CONGESTION, "rate_limited"
        )
        assert not (await query(service, "certificates")).is_error  # queries have their own bucket

    with_service(tmp_path / "memory.sqlite3", body, rate=2.0, burst=3.0)


def test_refused_arguments_spend_no_tokens(tmp_path: Path) -> None:
    async def body(service: MemoryService) -> None:
        for _ in range(5):
            refused(await add(service, ""), BAD, "bad_request", "content")
        assert not (await add(service, TLS)).is_error

    with_service(tmp_path / "memory.sqlite3", body, burst=1.0)


def test_chunk_cap_per_depositor(tmp_path: Path) -> None:
    two_chunks = f"{sentences(12)}\n\n{sentences(12, 3)}"
    assert len(chunk_text(two_chunks)) == 2

    async def body(service: MemoryService) -> None:
        assert not (await add(service, two_chunks, document_id="a")).is_error
        refused(
            await add(service, two_chunks, document_id="b"),
            BAD,
            "quota_exceeded",
            "4 chunks",
            "3",
        )
        assert await service.store.count(ALICE) == 2  # the refused deposit changed nothing
        assert not (await add(service, TLS, document_id="b")).is_error  # 3: at the cap
        assert not (await add(service, SOURDOUGH, document_id="a")).is_error  # replacing
        assert not (await add(service, two_chunks, BOB, document_id="a")).is_error

    with_service(tmp_path / "memory.sqlite3", body, max_chunks_per_depositor=3)


async def summed_usage(store: MemoryStore) -> tuple[int, int]:
    """``usage`` recomputed by a scan, to hold the triggers' running totals against."""
    rows = await store._fetchall(
        "SELECT count(*), coalesce(sum(length(CAST(text AS BLOB))"
        " + length(CAST(source_label AS BLOB)) + length(CAST(topics AS BLOB))), 0) FROM chunks"
    )
    return int(rows[0][0]), int(rows[0][1])


def test_the_global_byte_cap_refuses_growth_but_serves_everyone_else(tmp_path: Path) -> None:
    cap = 2_000

    async def body(service: MemoryService) -> None:
        documents = 0
        while not (
            outcome := await add(service, f"{TLS} {documents}", document_id=f"d{documents}")
        ).is_error:
            documents += 1
        detail = refused(outcome, BAD, "quota_exceeded", "shared memory is full", str(cap))
        assert "replace" in detail and documents >= 4
        held = await service.store.usage()
        assert held == await summed_usage(service.store) and held[1] <= cap
        assert await service.store.count() == documents  # the refused deposit changed nothing
        refused(await add(service, SOURDOUGH, BOB, now=NOW + 1), BAD, "quota_exceeded")
        assert hits(await query(service, "certificate rotation"))  # recall is unaffected
        short = "TLS: rotate before expiry, always."
        assert not (await add(service, short, document_id="d0")).is_error  # shorter: it passes
        assert (await service.store.usage())[1] < held[1]
        assert not (await add(service, SOURDOUGH, BOB, now=NOW + 2)).is_error  # room again
        assert await service.store.usage() == await summed_usage(service.store)

    with_service(tmp_path / "memory.sqlite3", body, max_total_bytes=cap, burst=100.0)


def test_usage_is_computed_when_an_old_file_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "memory.sqlite3"

    class VersionOne(MemoryStore):
        MIGRATIONS = MemoryStore.MIGRATIONS[:1]

    async def go() -> None:
        async with await VersionOne.open(path) as old:
            for depositor, content in ((ALICE, TLS), (BOB, SOURDOUGH)):
                await old.replace_document(
                    depositor,
                    "doc",
                    [content],
                    source_label="é",
                    topics=["t"],
                    now_ms=NOW,
                    max_chunks=10,
                )
            assert await old.schema_version() == 1
        async with await MemoryStore.open(path) as store:
            assert await store.schema_version() == 2
            held = await store.usage()
            assert held == await summed_usage(store) and held[0] == 2

    asyncio.run(go())


def test_queries_are_rate_limited_per_caller(tmp_path: Path) -> None:
    async def body(service: MemoryService) -> None:
        assert not (await add(service, TLS)).is_error
        ask = {"query_text": "certificates"}
        for _ in range(2):
            assert hits(await service.handle(MEMORY_QUERY, ask, BOB, NOW))
        refused(await query(service, "tls", top_k=0), BAD, "bad_request")  # spends no token
        detail = refused(
            await service.handle(MEMORY_QUERY, ask, BOB, NOW + 10),
            ErrorCode.UPSTREAM_CONGESTION,
            "rate_limited",
            "queries",
            "retry in 490 ms",
        )
        assert detail
        assert hits(await service.handle(MEMORY_QUERY, ask, ALICE, NOW + 10))  # per caller
        assert hits(await service.handle(MEMORY_QUERY, ask, BOB, NOW + 510))  # refilled

    with_service(tmp_path / "memory.sqlite3", body, query_rate=2.0, query_burst=2.0)


# --- hostile and malformed input --------------------------------------------------------------

HOSTILE = (
    '"foo" OR NEAR(',
    "*",
    "-",
    ":",
    '"',
    "NEAR(a b, 3)",
    "text:certificates",
    "^rotate",
    "cert*",
    "AND OR NOT",
    "(((",
    "a\x00b",  # NUL is refused in stored text only
    "{source_label topics}: tls",
    "'; DROP TABLE chunks; --",
    "_",
    "\u0301\u0301",
    "日本語のテキスト",
)


@pytest.mark.parametrize("text", HOSTILE)
def test_fts_syntax_in_queries_never_errors(tmp_path: Path, text: str) -> None:
    async def body(service: MemoryService) -> None:
        await add(service, TLS)
        hits(await query(service, text))
        assert await service.store.count() == 1

    with_service(tmp_path / "memory.sqlite3", body)


def test_empty_query_answers_no_hits(tmp_path: Path) -> None:
    async def body(service: MemoryService) -> None:
        await add(service, TLS)
        for text in ("", "   ", "?!*-"):
            outcome = await query(service, text)
            assert outcome.payload == {"hits": []}

    with_service(tmp_path / "memory.sqlite3", body)


BAD_ADDS: tuple[tuple[object, str], ...] = (
    ("not a map", "map"),
    ({}, "content"),
    ({"content": ""}, "content"),
    ({"content": b"bytes"}, "content"),
    ({"content": "a\x00b"}, "NUL"),
    ({"content": "bad \udc80 text"}, "content"),
    ({"content": TLS, "topics": "tls"}, "topics"),
    ({"content": TLS, "topics": ["tls", 7]}, "topics[1]"),
    ({"content": TLS, "topics": [" "]}, "topics[0]"),
    ({"content": TLS, "topics": ["t"] * 33}, "topics"),
    ({"content": TLS, "document_id": ""}, "document_id"),
    ({"content": TLS, "document_id": 5}, "document_id"),
    ({"content": TLS, "source_label": "x" * 201}, "source_label"),
)


@pytest.mark.parametrize(("payload", "named"), BAD_ADDS)
def test_malformed_deposits_are_named(tmp_path: Path, payload: object, named: str) -> None:
    async def body(service: MemoryService) -> None:
        outcome = await service.handle(MEMORY_ADD, payload, ALICE, NOW)
        refused(outcome, BAD, "bad_request", named)
        assert await service.store.count() == 0

    with_service(tmp_path / "memory.sqlite3", body)


def test_malformed_queries_callers_and_procedures(tmp_path: Path) -> None:
    async def body(service: MemoryService) -> None:
        refused(await service.handle(MEMORY_QUERY, [], BOB, NOW), BAD, "bad_request", "map")
        refused(await service.handle(MEMORY_QUERY, {}, BOB, NOW), BAD, "bad_request", "query_text")
        refused(
            await service.handle(MEMORY_QUERY, {"query_text": 3}, BOB, NOW),
            BAD,
            "bad_request",
            "query_text",
        )
        refused(await add(service, TLS, b"short"), BAD, "bad_request", "caller")
        unknown = await service.handle("macula.memory.forget_v1", {}, ALICE, NOW)
        assert (unknown.code, unknown.detail) == (ErrorCode.UNKNOWN_NEXT_PEER, None)

    with_service(tmp_path / "memory.sqlite3", body)


def test_a_failing_store_answers_0x02_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def go() -> None:
        store = await MemoryStore.open(tmp_path / "memory.sqlite3")
        service = MemoryService(store)
        await store.close()
        for outcome in (await add(service, TLS), await query(service, "certificates")):
            assert (outcome.code, outcome.detail) == (ErrorCode.TEMPORARY_RELAY_FAILURE, None)

    run(go())
    assert "failed" in caplog.text


# --- durability -------------------------------------------------------------------------------


def test_deposits_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "house" / "memory.sqlite3"

    async def deposit(service: MemoryService) -> None:
        await add(service, TLS, source_label="ops", topics=["tls"], document_id="tls-howto")
        await add(service, SOURDOUGH, BOB)

    async def recall(service: MemoryService) -> list[dict[str, Any]]:
        assert await service.store.schema_version() == 2
        assert await service.store.integrity_check() == "ok"
        return hits(await query(service, "certificate rotation"))

    with_service(path, deposit)
    (hit,) = with_service(path, recall)
    assert (hit["text"], hit["document_id"], hit["topics"], hit["source_label"]) == (
        TLS,
        "tls-howto",
        ["tls"],
        "ops",
    )
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700


# --- the token buckets ------------------------------------------------------------------------


def test_token_buckets_refill_cap_and_forget() -> None:
    buckets = TokenBuckets(rate=1.0, burst=2.0, max_tracked=2)
    assert [buckets.take(ALICE, 0) for _ in range(3)] == [0, 0, 1000]
    assert buckets.take(ALICE, -5000) > 0  # a clock stepping back refills nothing
    assert buckets.take(ALICE, 10_000) == 0  # refilled, but never beyond the burst
    assert buckets.take(ALICE, 10_000) == 0
    assert buckets.take(ALICE, 10_000) > 0
    assert buckets.take(BOB, 10_000) == 0
    assert buckets.take(bytes(32), 10_000) == 0  # a third key: the oldest is forgotten
    with pytest.raises(ValueError):
        TokenBuckets(rate=0.0, burst=1.0)


def test_token_buckets_wait_exactly_and_forget_refilled_buckets_first() -> None:
    buckets = TokenBuckets(rate=3.0, burst=1.0)
    assert buckets.take(ALICE, 0) == 0
    assert buckets.take(ALICE, 100) == 234  # 0.3 tokens banked: 0.7 / 3 per s = 233.3 ms
    buckets = TokenBuckets(rate=1.0, burst=2.0, max_tracked=2)
    assert [buckets.take(BOB, 0), buckets.take(BOB, 0), buckets.take(ALICE, 0)] == [0, 0, 0]
    assert buckets.take(bytes(32), 1000) == 0  # ALICE has refilled: she is forgotten, not BOB
    assert [buckets.take(BOB, 1000), buckets.take(BOB, 1000)] == [0, 1000]


# --- the quality script -----------------------------------------------------------------------


def test_memory_quality_script_prints_its_figures() -> None:
    script = SCRIPTS / "memory-quality.py"
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for figure in ("recall@1", "recall@5", "MRR"):
        assert re.search(rf"^{figure} [01]\.\d+$", done.stdout, re.MULTILINE), done.stdout
