"""Live check: publish/subscribe between two processes through a station, across a restart.

``uv run python scripts/pubsub-two-process-check.py [--station node_id@host:port]``
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from livecheck import Checks, Child, LocalStation, check_main, restart

TOPIC = "livecheck.news"
COUNT = 20


def _received(child: Child, run: str, settle_s: float = 5.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline:
        got = [e for e in child.events if e["payload"].get("run") == run]
        if len(got) >= COUNT:
            return got
        child.request("whoami")  # collects events that arrived meanwhile
        time.sleep(0.1)  # polling interval: until every event has arrived
    return [e for e in child.events if e["payload"].get("run") == run]


def body(checks: Checks, station: LocalStation | None, workdir: Path, endpoint: str) -> None:
    subscriber = Child("subscriber", endpoint, workdir)
    publisher = Child("publisher", endpoint, workdir)
    try:
        publisher_id = publisher.request("whoami").get("node_id")
        checks.check(
            "two processes connected with separate identities",
            bool(publisher_id) and publisher_id != subscriber.request("whoami").get("node_id"),
        )
        checks.check(
            "subscriber subscribed", subscriber.request("subscribe", topic=TOPIC)["ok"] == 1
        )
        sent = publisher.request("publish", topic=TOPIC, count=COUNT, run="before")
        got = _received(subscriber, "before")
        checks.check(
            f"{COUNT} events delivered in order",
            [e["payload"]["n"] for e in got] == list(range(COUNT)),
            f"{len(got)}/{COUNT}",
        )
        checks.check(
            "events carry the publisher's id and seq",
            all(e["publisher"] == publisher_id for e in got)
            and [e["seq"] for e in got] == sent.get("seqs"),
        )
        checks.check(
            "every event is end-to-end authenticated (publisher_sig)",
            all(e["authenticated"] == 1 for e in got),
        )
        if restart(checks, station):
            for child in (subscriber, publisher):
                answer = child.request("wait_reconnected", timeout=60)
                checks.check(
                    f"{child.name} reconnected on its own",
                    answer["ok"] == 1,
                    str(answer.get("states")),
                )
            publisher.request("publish", topic=TOPIC, count=COUNT, run="after")
            after = _received(subscriber, "after")
            checks.check(
                "events flow again after the restart without re-subscribing",
                len(after) == COUNT,
                f"{len(after)}/{COUNT}",
            )
        seqs = [e["seq"] for e in subscriber.events]
        checks.check("no event delivered twice", len(seqs) == len(set(seqs)))
    finally:
        subscriber.close()
        publisher.close()


if __name__ == "__main__":
    check_main(__doc__ or "", body)
