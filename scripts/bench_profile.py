"""Summarise a py-spy profile: top self-time functions and the share of each area.

Run: ``python scripts/bench.py profile PROFILE.txt [--top N] [--callers FUNCTION]`` on the
output of ``py-spy record --nolineno --format raw`` (how docs/performance.md made its profiles).

Invariants: a sample whose innermost frame is a thread waiting (the event loop in ``select``,
aiosqlite's worker on its queue, an idle thread-pool worker) is left out and counted apart, so
the shares are of busy time; the input is only read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import bench_common

WAITING = (
    "EpollSelector.select ",
    "_connection_worker_thread ",
    "_worker (concurrent/",
    "Front._read ",  # macula-mcp's stdin reader thread, blocked in os.read
)
AREAS = (
    ("aioquic/", "aioquic"),
    ("nacl/", "Ed25519 (PyNaCl)"),
    ("wire/cbor.py", "CBOR (macula.wire.cbor)"),
    ("asyncio/", "asyncio"),
    ("macula/", "macula (other)"),
    ("relay/", "relay (other)"),
    ("importlib", "imports"),
)


def area(frame: str) -> str:
    return next((name for key, name in AREAS if key in frame), "other")


def stacks(path: Path) -> list[tuple[list[str], int]]:
    rows = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            rows.append((stack.split(";"), int(count)))
    return rows


def summarise(path: Path, top: int, callers: str | None) -> None:
    busy: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    chains: Counter[str] = Counter()
    waiting = 0
    for frames, count in stacks(path):
        leaf = frames[-1]
        if leaf.startswith(WAITING):
            waiting += count
            continue
        busy[leaf] += count
        areas[area(leaf)] += count
        if callers and leaf.startswith(callers + " "):
            chains[" < ".join(f.split(" (")[0] for f in reversed(frames[-5:-1]))] += count
    total = sum(busy.values()) or 1
    print(f"{path}: {total:,} busy samples ({waiting:,} waiting left out)")
    print(
        "self time by area: "
        + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in areas.most_common())
    )
    for frame, count in busy.most_common(top):
        print(f"{100 * count / total:5.1f}%  {frame}")
    for chain, count in chains.most_common(8):
        print(f"{100 * count / total:5.1f}%  {callers} < {chain}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_common.parser("profile", __doc__)
    parser.add_argument("profiles", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--callers", help="also show who calls this function (its self time)")
    args = parser.parse_args(argv)
    for path in args.profiles:
        summarise(path, args.top, args.callers)


if __name__ == "__main__":  # run through the one entry point: python scripts/bench.py profile
    raise SystemExit(f"{__file__}: run it as `python scripts/bench.py profile ...`")
