"""The benchmark scripts run end to end with ``--quick``: a station on loopback, every figure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
FIGURES = (
    "pub/sub 1:1",
    "fan-out 1→",
    "RPC latency p50",
    "RPC latency p99",
    "RPC calls/s, 1 in flight",
    "RPC calls/s, 50 in flight",
    "connect p50",
    "publish→deliver p50",
    "publish→deliver p99",
)


def run(script: str, *args: str) -> str:
    completed = subprocess.run(
        [sys.executable, str(SCRIPTS / script), "--quick", *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "FAILED" not in completed.stdout, completed.stdout + completed.stderr
    return completed.stdout


@pytest.mark.slow
def test_bench_station_quick_prints_every_figure() -> None:
    out = run("bench_station.py")
    for figure in FIGURES:
        assert f"macula {figure}" in out, f"{figure!r} missing from:\n{out}"
    assert "0 dropped" in out
    # with nats-server and nats-py present the peer runs too; otherwise one line says why not
    assert "ratios ours/nats" in out or "NATS comparison not run" in out


@pytest.mark.slow
def test_bench_client_prints_only_client_figures() -> None:
    out = run("bench_client.py", "--no-nats")
    assert "macula RPC calls/s, 50 in flight" in out
    assert "macula publish→deliver p50" in out
    assert "pub/sub 1:1" not in out
