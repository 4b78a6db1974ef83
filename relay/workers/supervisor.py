"""The parent of ``macula-relay --workers N``: starts the workers, keeps them running, stops them.

``supervise`` starts every worker (``relay.workers.balancer.worker_command``) and waits for each
one's
endpoint line; once all are up it prints the station's one line (``node_id@host:port``),
writes ``--endpoint-file``/``--pid-file`` and tells systemd READY (``relay.ops.sdnotify``; the
workers are not given ``NOTIFY_SOCKET``). A worker that dies (a signal or a non-zero exit) is
started again after a backoff (``restart_delay``: doubling from ``RESTART_BASE_S`` to
``RESTART_MAX_S``, reset once a worker ran ``STABLE_S``); a worker that exits 0 by itself
(``--exit-when-gone``) stops the station. SIGTERM/SIGINT: every worker is sent SIGTERM and
awaited (SIGKILL past ``STOP_BUDGET_S``), exit 0. SIGHUP is passed on to every worker, which
re-reads its options. A worker that fails before the station was ever up ends the start: the
others are stopped and the parent exits with that worker's exit code. Workers die with the
parent (``PR_SET_PDEATHSIG`` on Linux), so a killed parent leaves no station behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from relay.ops.sdnotify import Notifier

log = logging.getLogger("macula.relay.workers")

RESTART_BASE_S = 0.5
RESTART_MAX_S = 30.0
STABLE_S = 10.0  # a worker up this long starts its backoff afresh
STOP_BUDGET_S = 6.0  # a worker's own shutdown takes at most 5 s
NOT_FOR_WORKERS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def restart_delay(failures: int) -> float:
    """Seconds before starting a worker again after ``failures`` short-lived runs."""
    return float(min(RESTART_MAX_S, RESTART_BASE_S * 2.0 ** min(failures, 16)))


def worker_environment(environ: dict[str, str]) -> dict[str, str]:
    """The workers' environment: the parent's, without systemd's notify variables."""
    return {key: value for key, value in environ.items() if key not in NOT_FOR_WORKERS}


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class StartFailed(Exception):
    """A worker ended before the station was up; ``code`` is its exit code."""

    def __init__(self, index: int, code: int) -> None:
        super().__init__(f"worker {index} exited with code {code} before listening")
        self.code = code


@dataclass
class Supervisor:
    commands: list[list[str]]
    endpoint: str  # what the station prints once every worker is up
    on_ready: Callable[[], None] = lambda: None  # the endpoint and pid files
    environ: dict[str, str] = field(default_factory=lambda: worker_environment(dict(os.environ)))
    notifier: Notifier = field(default_factory=Notifier.from_environment)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    processes: dict[int, asyncio.subprocess.Process] = field(default_factory=dict)
    restarts: int = 0
    _up: set[int] = field(default_factory=set)
    _ready: asyncio.Event = field(default_factory=asyncio.Event)
    _failed: StartFailed | None = None

    async def run(self) -> int:
        """Serve until stopped; the exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._pass_on, signal.SIGHUP)
        try:
            async with asyncio.TaskGroup() as group:
                for index in range(len(self.commands)):
                    group.create_task(self._keep(index))
                group.create_task(self._announce())
                await self.stop.wait()
                self._ready.set()  # an announcement still waiting gives up
                self.notifier.stopping()
                log.info("stopping %d workers", len(self.commands))
                await self._stop_all()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.remove_signal_handler(sig)
        return 0 if self._failed is None else self._failed.code

    async def _announce(self) -> None:
        await self._ready.wait()
        if self.stop.is_set():
            return
        self.on_ready()
        print(self.endpoint, flush=True)
        log.info("all %d workers up: %s", len(self.commands), self.endpoint)
        self.notifier.ready(f"serving {self.endpoint} with {len(self.commands)} workers")
        if self.notifier.watchdog_s is not None:
            while not self.stop.is_set():
                self.notifier.watchdog()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), self.notifier.watchdog_s)

    async def _keep(self, index: int) -> None:
        """Run worker ``index``, starting it again when it dies, until the station stops."""
        failures = 0
        while not self.stop.is_set():
            started = time.monotonic()
            code = await self._run_once(index)
            if self.stop.is_set():
                return
            if code == 0:
                log.info("worker %d ended by itself: stopping the station", index)
                self.stop.set()
                return
            if not self._ready.is_set():
                self._failed = StartFailed(index, code if code > 0 else 1)
                log.error("%s: stopping the station", self._failed)
                self.stop.set()
                return
            failures = 0 if time.monotonic() - started >= STABLE_S else failures + 1
            delay = restart_delay(failures)
            log.warning(
                "worker %d exited with code %d; starting it again in %g s", index, code, delay
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), delay)
            self.restarts += 1

    async def _run_once(self, index: int) -> int:
        process = await asyncio.create_subprocess_exec(
            *self.commands[index],
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            env=self.environ,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        self.processes[index] = process
        if self.stop.is_set():  # started as the station began to stop
            process.terminate()
        assert process.stdout is not None
        line = await process.stdout.readline()
        if line:
            log.info("worker %d (pid %d) listening", index, process.pid)
            self._up.add(index)
            if len(self._up) == len(self.commands):
                self._ready.set()
        code = await process.wait()
        self._up.discard(index)
        return code

    def _pass_on(self, sig: signal.Signals) -> None:
        for process in list(self.processes.values()):
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(sig)

    async def _stop_all(self) -> None:
        self._pass_on(signal.SIGTERM)
        live = [p for p in self.processes.values() if p.returncode is None]
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in live)), STOP_BUDGET_S)
        except TimeoutError:
            for process in live:
                if process.returncode is None:
                    log.warning("worker pid %d did not stop in time: killed", process.pid)
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
            await asyncio.gather(*(p.wait() for p in live))
