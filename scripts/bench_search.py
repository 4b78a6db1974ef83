"""``mesh_search``'s two goals (issue 40; docs/search.md): a query's time over a big local
store, and what keeping the index costs ``mesh_say`` → ``mesh_wait_room``.

1. Query: a transcript of ``--messages`` messages (default 100,000: 20 rooms, 4 senders, texts of
   8 to 40 words drawn from a Zipf-like vocabulary of 5,000 words) and 2,000 tasks, written
   through the tables (the triggers index them as the agent's own writes do). Then ``--queries``
   searches through ``macula.agent.search.search`` (the tool's path minus MCP), in turn: a rare
   word, a common word, two words, a common word in one room, one from one sender, and one in a
   time window (after 12 unmeasured ones). Printed: p50, p99 and max of each search's time.
2. say → wait, indexing on vs off: ``bench_agent``'s measure (two ``macula-mcp`` processes and a
   station process), once with the index's triggers in both agents' transcripts and once with
   them dropped before the agents start (the only switch: nothing in the code turns the index
   off), alternating ``--rounds`` times. Printed: each run's p50 and the ratio of the medians.

Goals: query p50 <= 20 ms and p99 <= 50 ms at 100,000 messages; say → wait p50 with indexing at
most 5% slower than without.

Run: ``uv run python scripts/bench.py search [--messages 100000] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench_agent
import bench_common
from bench_common import child_process, percentile

from macula.agent.search import SearchRequest, search
from macula.store.tasks import TaskStore
from macula.store.transcript import TranscriptStore

GOAL_P50_MS = 20.0
GOAL_P99_MS = 50.0
GOAL_SLOWER = 0.05
VOCABULARY = 5_000
ROOMS = 20
SENDERS = [bytes([i + 1]) * 32 for i in range(4)]
OWNER = b"\x09" * 32
NOW = 1_800_000_000_000


def vocabulary(rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = {"".join(rng.choices(letters, k=rng.randint(3, 10))) for _ in range(VOCABULARY * 2)}
    return sorted(words)[:VOCABULARY]


def texts(rng: random.Random, words: list[str], count: int) -> list[str]:
    weights = [1 / (rank + 1) for rank in range(len(words))]  # Zipf: a few words are everywhere
    return [" ".join(rng.choices(words, weights, k=rng.randint(8, 40))) for _ in range(count)]


def fill(path: Path, tasks_path: Path, messages: int, rng: random.Random) -> list[str]:
    """The transcript and the tasks, written through their tables; the vocabulary."""
    words = vocabulary(rng)
    per_room = -(-messages // ROOMS)
    with sqlite3.connect(path) as db:
        rows = []
        for n, text in enumerate(texts(rng, words, messages)):
            at = NOW - (messages - n) * 1_000
            sender = SENDERS[n % len(SENDERS)].hex()
            rows.append((f"agents.room.{n // per_room:032x}", f"m{n}", sender, text, at, at))
        db.executemany(
            "INSERT INTO messages (room_topic, message_id, from_hex, kind, text, sent_at,"
            " received_ms, attested, envelope, read_ms) VALUES (?, ?, ?, 'remark_made', ?, ?, ?,"
            " 1, '{}', ?)",
            [(*row, row[-1]) for row in rows],
        )
    with sqlite3.connect(tasks_path) as db:
        db.executemany(
            "INSERT INTO tasks (owner, task_id, role, peer, title, input, state, state_seq,"
            " result, delivered, cancel_requested, created_ms, updated_ms) VALUES"
            " (?, ?, 'requester', ?, ?, ?, 'completed', 2, ?, 1, 0, ?, ?)",
            [
                (OWNER, f"t{n}", SENDERS[n % 4], " ".join(rng.sample(words[:500], 4)), body,
                 result, NOW, NOW)
                for n, (body, result) in enumerate(zip(texts(rng, words, 2_000),
                                                       texts(rng, words, 2_000), strict=True))
            ],
        )  # fmt: skip
    return words


def requests(words: list[str], count: int, messages: int) -> list[SearchRequest]:
    common, rare = words[:20], words[-500:]
    rng = random.Random(7)
    made: list[SearchRequest] = []
    for n in range(count):
        shape = n % 6
        if shape == 0:
            made.append(SearchRequest(rng.choice(rare)))
        elif shape == 1:
            made.append(SearchRequest(rng.choice(common)))
        elif shape == 2:
            made.append(SearchRequest(f"{rng.choice(common)} {rng.choice(words[20:400])}"))
        elif shape == 3:
            room = f"agents.room.{rng.randrange(ROOMS):032x}"
            made.append(SearchRequest(rng.choice(common), room_topic=room))
        elif shape == 4:
            made.append(SearchRequest(rng.choice(words[:200]), sender=rng.choice(SENDERS)))
        else:
            since = NOW - rng.randrange(messages) * 1_000
            made.append(SearchRequest(rng.choice(words[:200]), since_ms=since))
    return made


async def query_figures(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        path, tasks_path = Path(tmp) / "transcript.sqlite3", Path(tmp) / "tasks.sqlite3"
        for store in (TranscriptStore, TaskStore):  # the schema, with the index
            await (await store.open(path if store is TranscriptStore else tasks_path)).close()
        started = time.perf_counter()
        words = fill(path, tasks_path, args.messages, random.Random(1))
        print(f"{args.messages:,} messages and 2,000 tasks written and indexed in "
              f"{time.perf_counter() - started:.1f} s", flush=True)  # fmt: skip
        async with (
            await TranscriptStore.open(path) as transcript,
            await TaskStore.open(tasks_path) as tasks,
        ):
            for request in requests(words, 12, args.messages)[::-1]:  # warm: unmeasured
                await search(transcript, tasks, OWNER, request)
            took, hits = [], []
            for request in requests(words, args.queries, args.messages):
                begun = time.perf_counter()
                page = await search(transcript, tasks, OWNER, request)
                took.append((time.perf_counter() - begun) * 1e3)
                hits.append(page.total)
    figures = {
        "messages": args.messages,
        "queries": len(took),
        "p50_ms": statistics.median(took),
        "p99_ms": percentile(took, 0.99),
        "max_ms": max(took),
        "median_matches": statistics.median(hits),
    }
    print(
        f"query over {args.messages:,} messages: p50 {figures['p50_ms']:.2f}  p99 "
        f"{figures['p99_ms']:.2f}  max {figures['max_ms']:.2f} ms ({len(took)} queries, median "
        f"{figures['median_matches']:,.0f} matches); goal p50 <= {GOAL_P50_MS} ms: "
        f"{'met' if figures['p50_ms'] <= GOAL_P50_MS else 'no'}, p99 <= {GOAL_P99_MS} ms: "
        f"{'met' if figures['p99_ms'] <= GOAL_P99_MS else 'no'}",
        flush=True,
    )
    return figures


async def say_wait_p50(indexing: bool, args: argparse.Namespace) -> float:
    """``bench_agent``'s say → wait p50, with the index's triggers or without them."""
    with tempfile.TemporaryDirectory(prefix="bench-search-agent-") as tmp:
        homes = [Path(tmp) / "a", Path(tmp) / "b"]
        for home in homes:
            path = home / "transcript.sqlite3"
            await (await TranscriptStore.open(path)).close()
            if not indexing:
                with sqlite3.connect(path) as db:
                    for trigger in ("insert", "delete", "update"):
                        db.execute(f"DROP TRIGGER messages_fts_{trigger}")
        async with (
            child_process("serve-station", "1800", ready="endpoint") as station,
            bench_agent.mcp_agent("bench-a", homes[0], station.said) as a,
            bench_agent.mcp_agent("bench-b", homes[1], station.said) as b,
        ):
            room = (await a.call("mesh_open_room", purpose="bench"))["room_topic"]
            await b.call("mesh_join_room", room_topic=room)
            await a.call("mesh_wait_room", room_topic=room, wait_seconds=bench_agent.WAIT_S)
            while (await b.call("mesh_wait_room", room_topic=room, wait_seconds=0.05))["count"]:
                pass
            settle = args.settle_ms / 1e3
            for n in range(args.warmup):
                await bench_agent.one_message(a, b, room, n, settle)
            took = [
                (await bench_agent.one_message(a, b, room, n, settle))[0]
                for n in range(args.say_messages)
            ]
    p50 = statistics.median(took)
    print(f"say → wait p50, indexing {'on ' if indexing else 'off'}: {p50:6.2f} ms", flush=True)
    return p50


async def index_cost(args: argparse.Namespace) -> dict[str, Any]:
    on: list[float] = []
    off: list[float] = []
    for _ in range(args.rounds):
        off.append(await say_wait_p50(False, args))
        on.append(await say_wait_p50(True, args))
    slower = statistics.median(on) / statistics.median(off) - 1
    print(
        f"say → wait p50 with indexing: {100 * slower:+.1f}% (median of {args.rounds} runs each);"
        f" goal <= +{100 * GOAL_SLOWER:.0f}%: {'met' if slower <= GOAL_SLOWER else 'no'}",
        flush=True,
    )
    return {"say_wait_p50_on_ms": on, "say_wait_p50_off_ms": off, "slower": slower}


def main(argv: Sequence[str] | None = None) -> None:
    arguments = bench_common.parser("search", __doc__)
    arguments.add_argument("--messages", type=int, default=100_000)
    arguments.add_argument("--queries", type=int, default=600)
    arguments.add_argument("--say-messages", type=int, default=200)
    arguments.add_argument("--warmup", type=int, default=10)
    arguments.add_argument("--rounds", type=int, default=3, help="say → wait runs, on and off")
    arguments.add_argument("--settle-ms", type=float, default=30.0)
    arguments.add_argument("--no-agents", action="store_true", help="the query figures only")
    arguments.add_argument("--quick", action="store_true", help="a smoke run: small and short")
    arguments.add_argument("--json", type=Path, help="write the figures to this file")
    args = arguments.parse_args(argv)
    if args.quick:
        args.messages, args.queries, args.say_messages, args.warmup, args.rounds = (
            2_000, 30, 5, 2, 1,
        )  # fmt: skip
    result = {"query": asyncio.run(query_figures(args))}
    if not args.no_agents:
        result["say_wait"] = asyncio.run(index_cost(args))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":  # run through the one entry point: python scripts/bench.py search
    raise SystemExit(f"{__file__}: run it as `python scripts/bench.py search ...`")
