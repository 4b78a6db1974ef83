"""Issue 15's goals checked against one run's figures: the closing table and the JSON document.

Invariants: a goal is either a ratio of ours to one peer's figure with the same key (the peer
measured in the same run) or a bound on our figure alone; a goal whose figures are missing is
reported as ``unknown``, never as met; "met" is the string ``yes``/``no``/``unknown`` (no
booleans in what agents may read); sizes in KB are 1,000 bytes.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench_common import Figure


@dataclass(frozen=True)
class Goal:
    key: str
    text: str
    peer: str | None  # the system whose figure with the same key is the reference
    bound: float
    higher_is_better: bool  # ratio (or value) must be >= bound, else <= bound
    by_ratio: bool  # bound applies to ours/peer, else to ours alone (the peer shown for scale)


GOALS = (
    Goal("pubsub", "pub/sub 1:1 128 B >= 1.0x amqtt", "amqtt", 1.0, True, True),
    Goal("fanout", "fan-out 1->50 >= 1.0x amqtt", "amqtt", 1.0, True, True),
    Goal("rpc_p50", "RPC p50 <= 2.5x NATS", "nats", 2.5, False, True),
    Goal("rpc_p99", "RPC p99 <= 3x NATS", "nats", 3.0, False, True),
    Goal("connect_p50", "connect p50 <= 5 ms", "nats", 5.0, False, False),
    Goal("content", "content 16 MiB >= 0.8x raw aioquic", "aioquic", 0.8, True, True),
    Goal("idle_kib", "memory/idle conn <= 64 KiB", None, 64.0, False, False),
    Goal("tools_list_full", "tools/list full <= 30 KB", None, 30_000.0, False, False),
    Goal("tools_list_terse", "tools/list terse <= 20 KB", None, 20_000.0, False, False),
)


@dataclass(frozen=True)
class Verdict:
    goal: str
    key: str
    ours: float | None
    unit: str
    peer: str | None
    peer_value: float | None
    ratio: float | None  # ours/peer when both exist
    met: str  # yes / no / unknown


def judge(figures: dict[str, dict[str, Figure]]) -> list[Verdict]:
    verdicts = []
    for goal in GOALS:
        mine = figures.get("macula", {}).get(goal.key)
        theirs = figures.get(goal.peer, {}).get(goal.key) if goal.peer else None
        ours = mine.value if mine and math.isfinite(mine.value) else None
        peer_value = theirs.value if theirs and math.isfinite(theirs.value) else None
        ratio = ours / peer_value if ours is not None and peer_value else None
        measured = ratio if goal.by_ratio else ours
        if measured is None:
            met = "unknown"
        elif goal.higher_is_better:
            met = "yes" if measured >= goal.bound else "no"
        else:
            met = "yes" if measured <= goal.bound else "no"
        unit = mine.unit if mine else ""
        verdicts.append(Verdict(goal.text, goal.key, ours, unit, goal.peer, peer_value, ratio, met))
    return verdicts


def number(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.1f}" if abs(value) < 100 else f"{value:,.0f}"


def print_table(verdicts: list[Verdict], quick: bool) -> None:
    print("\ngoals (issue 15): ours vs the peer measured in this run", flush=True)
    if quick:
        print("QUICK RUN: smaller counts than the goals name (fan-out, content, idle connections);")
        print("the verdicts below are a smoke check, not a measurement of the goals")
    print("(ratio = ours/peer; connect, memory and tools/list goals bound ours alone)")
    header = f"{'goal':<38}{'ours':>14}  {'unit':<13}{'peer':>16}{'ratio':>9}  met"
    print(header)
    print("-" * len(header))
    for v in verdicts:
        peer = f"{v.peer} {number(v.peer_value)}" if v.peer else "—"
        ratio = f"{v.ratio:.3f}" if v.ratio is not None else "—"
        print(f"{v.goal:<38}{number(v.ours):>14}  {v.unit:<13}{peer:>16}{ratio:>9}  {v.met}")
    print(flush=True)


def machine() -> dict[str, Any]:
    try:
        uptime = subprocess.run(
            ["uptime"], capture_output=True, text=True, timeout=5, check=False
        ).stdout.strip()
    except OSError:
        uptime = ""
    return {"cpus": os.cpu_count(), "loadavg": list(os.getloadavg()), "uptime": uptime}


def finite(row: dict[str, Any]) -> dict[str, Any]:
    """A figure's row with a missing measurement (NaN, infinity) as null: JSON has no NaN."""
    value = row["value"]
    return {**row, "value": value if math.isfinite(value) else None}


def write_json(
    path: Path,
    mode: str,
    figures: dict[str, dict[str, Figure]],
    skipped: dict[str, str],
    verdicts: list[Verdict],
    started: dict[str, Any],
) -> None:
    document = {
        "mode": mode,
        "machine_at_start": started,
        "machine_at_end": machine(),
        "figures": {
            system: {key: finite(asdict(figure)) for key, figure in by_key.items()}
            for system, by_key in figures.items()
        },
        "skipped": skipped,
        "goals": [asdict(v) for v in verdicts],
    }
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    print(f"figures written to {path}", flush=True)
