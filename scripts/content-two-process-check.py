"""Live check: content stored by one process, fetched and verified by another, across a restart.

``uv run python scripts/content-two-process-check.py [--station node_id@host:port]``
"""

from __future__ import annotations

from pathlib import Path

from livecheck import Checks, Child, LocalStation, check_main, restart

SIZES = {
    "1 byte": 1,
    "256 KiB (one block)": 256 * 1024,
    "3 MiB (chunks + manifest)": 3 * 1024 * 1024,
}


def body(checks: Checks, station: LocalStation | None, workdir: Path, endpoint: str) -> None:
    writer = Child("writer", endpoint, workdir)
    reader = Child("reader", endpoint, workdir)
    stored: dict[str, dict[str, object]] = {}
    try:
        for label, size in SIZES.items():
            put = writer.request("put", size=size, timeout=60)
            got = reader.request("get", mcid=put.get("mcid", ""), timeout=60) if put["ok"] else put
            checks.check(
                f"{label}: stored by one process, fetched and verified by the other",
                got["ok"] == 1 and got["sha256"] == put["sha256"] and got["size"] == size,
                str(put.get("mcid", put.get("error")))[:24],
            )
            stored[label] = put
        bogus = reader.request("get", mcid="0155" + "00" * 32)
        checks.check(
            "an unknown content id is a clear not_found error",
            bogus["ok"] == 0 and "not_found" in bogus["error"],
        )
        if restart(checks, station):
            for child in (writer, reader):
                answer = child.request("wait_reconnected", timeout=60)
                checks.check(
                    f"{child.name} reconnected on its own",
                    answer["ok"] == 1,
                    str(answer.get("states")),
                )
            big = stored["3 MiB (chunks + manifest)"]
            again = reader.request("get", mcid=big["mcid"], timeout=60)
            checks.check(
                "content survived the station restart",
                again["ok"] == 1 and again["sha256"] == big["sha256"],
            )
            put = writer.request("put", size=1024 * 1024, timeout=60)
            got = reader.request("get", mcid=put.get("mcid", ""), timeout=60)
            checks.check(
                "new content flows after the restart",
                got["ok"] == 1 and got.get("sha256") == put.get("sha256"),
            )
    finally:
        writer.close()
        reader.close()


if __name__ == "__main__":
    check_main(__doc__ or "", body)
