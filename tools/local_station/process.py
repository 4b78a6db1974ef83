"""A station in a process of its own, started through its entry point (``python -m relay.ops.cli``):
``tools`` never imports ``relay`` (DESIGN.md), it runs it.

Invariants:
- the child is this interpreter (``sys.executable``) with ``PYTHONPATH`` naming where the
  ``relay`` package it would import lives (``relay_environment``: found by
  ``importlib.util.find_spec``, nothing imported), so a checkout run without installing works;
- ``station_process`` yields the one line the station prints once it listens
  (``node_id@127.0.0.1:port``); a station that exits or prints something else first, or says
  nothing within ``timeout_s``, raises ``StationProcessError`` quoting its last output;
- on leaving, the station gets SIGTERM (it says goodbye to its clients) and is waited for;
  one still running after ``STOP_TIMEOUT_S`` is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Final

from macula.errors import MaculaError

STOP_TIMEOUT_S: Final = 8.0  # the station drains within 5 s (relay.ops.cli)


class StationProcessError(MaculaError):
    """The station process did not start listening (the message quotes its last output)."""


def relay_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with ``PYTHONPATH`` led by the directory holding the ``relay`` package this
    interpreter would import (unchanged when it finds none: the child then says so)."""
    spec = importlib.util.find_spec("relay")
    found = dict(env)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if locations:
        source = str(Path(locations[0]).resolve().parent)
        found["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
    return found


def relay_command(*arguments: str) -> list[str]:
    """The command line running ``macula-relay`` with ``arguments`` in this interpreter."""
    return [sys.executable, "-m", "relay.ops.cli", *arguments]


@contextlib.asynccontextmanager
async def station_process(
    data_dir: Path, timeout_s: float = 20.0, port: int = 0
) -> AsyncIterator[str]:
    """A station on ``data_dir`` listening on ``port`` of 127.0.0.1 (0: a free one), logging to
    ``data_dir/station.log``; yields its endpoint, stops it on leaving. Started again on the
    same ``data_dir`` and port it is the same station: same key, same endpoint."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    out = data_dir / "station.out"
    command = relay_command(
        "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir),
        "--log-file", str(data_dir / "station.log"),
    )  # fmt: skip
    with out.open("wb") as sink:
        child = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=sink, env=relay_environment(os.environ),
        )  # fmt: skip
    try:
        yield await _endpoint(child, out, timeout_s)
    finally:
        await _stop(child)


async def _endpoint(child: asyncio.subprocess.Process, out: Path, timeout_s: float) -> str:
    assert child.stdout is not None
    try:
        line = await asyncio.wait_for(child.stdout.readline(), timeout_s)
    except TimeoutError:
        raise StationProcessError(
            f"the station did not listen within {timeout_s:g} s{_last_words(out)}"
        ) from None
    endpoint = line.decode(errors="replace").strip()
    if "@" not in endpoint:
        code = await child.wait() if not endpoint else None
        said = f"exited with status {code}" if code is not None else f"printed {endpoint[:80]!r}"
        raise StationProcessError(f"the station {said} before listening{_last_words(out)}")
    return endpoint


async def _stop(child: asyncio.subprocess.Process) -> None:
    if child.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            child.terminate()
        try:
            await asyncio.wait_for(child.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            await child.wait()


def _last_words(out: Path) -> str:
    try:
        text = out.read_bytes()[-400:].decode(errors="replace").strip()
    except OSError:
        text = ""
    last = text.splitlines()[-1] if text else ""
    return f": {last} (see {out})" if last else f" (see {out})"
