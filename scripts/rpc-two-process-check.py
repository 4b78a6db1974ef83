"""Live check: a procedure served by one process and called by another, across a restart.

``uv run python scripts/rpc-two-process-check.py [--station node_id@host:port]``
"""

from __future__ import annotations

from pathlib import Path

from livecheck import Checks, Child, LocalStation, check_main, restart

PROCEDURE = "org.macula.livecheck.echo_v1"
CALLS = 20


def calls_succeed(checks: Checks, caller: Child, caller_id: str, label: str) -> None:
    answers = [caller.request("call", procedure=PROCEDURE, payload={"i": i}) for i in range(CALLS)]
    good = [
        i
        for i, answer in enumerate(answers)
        if answer["ok"] == 1 and answer["result"] == {"echo": {"i": i}, "caller": caller_id}
    ]
    detail = f"{len(good)}/{CALLS}" + ("" if good else f": {answers[0]}")
    checks.check(label, len(good) == CALLS, detail)


def body(checks: Checks, station: LocalStation | None, workdir: Path, endpoint: str) -> None:
    provider = Child("provider", endpoint, workdir)
    caller = Child("caller", endpoint, workdir)
    try:
        caller_id = caller.request("whoami").get("node_id", "")
        checks.check(
            "provider advertised the procedure",
            provider.request("advertise", procedure=PROCEDURE)["ok"] == 1,
        )
        calls_succeed(
            checks,
            caller,
            caller_id,
            f"{CALLS} calls answered by the other process, caller attested",
        )
        failed = caller.request("call", procedure=PROCEDURE, payload={"fail": 1})
        checks.check(
            "a handler exception comes back as 0x0F handler_error, its text kept by the provider",
            failed["ok"] == 0
            and failed.get("code") == 0x0F
            and "handler_error" in failed["error"]
            and "asked to fail" not in failed["error"],
        )
        missing = caller.request("call", procedure="org.macula.livecheck.nobody_v1", payload={})
        checks.check(
            "an unserved procedure is answered 0x01 unknown_next_peer", missing.get("code") == 0x01
        )
        if restart(checks, station):
            for child in (provider, caller):
                answer = child.request("wait_reconnected", timeout=60)
                checks.check(
                    f"{child.name} reconnected on its own",
                    answer["ok"] == 1,
                    str(answer.get("states")),
                )
            calls_succeed(
                checks,
                caller,
                caller_id,
                "calls succeed again after the restart (advertisement replayed)",
            )
    finally:
        provider.close()
        caller.close()


if __name__ == "__main__":
    check_main(__doc__ or "", body)
