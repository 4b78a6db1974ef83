"""The benchmark scripts run end to end with ``--quick``: a station on loopback, every figure.

The goals table is checked on figures made up here (no timed assertion anywhere): a goal is
met, missed, or ``unknown`` when a figure or its peer is missing, never met by default.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import bench_goals  # noqa: E402
from bench_common import Figure  # noqa: E402

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
OUR_KEYS = {
    "pubsub",
    "fanout",
    "rpc_p50",
    "rpc_p99",
    "rpc_1",
    "rpc_50",
    "connect_p50",
    "e2e_p50",
    "e2e_p99",
    "content",
    "idle_kib",
    "tools_list_full",
    "tools_list_terse",
}


def run(script: str, *args: str, quick: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / script), *(["--quick"] if quick else []), *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def ran(script: str, *args: str) -> str:
    completed = run(script, *args)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "FAILED" not in completed.stdout, completed.stdout + completed.stderr
    return completed.stdout


def shown(system: str, label: str, out: str) -> bool:
    return re.search(rf"^{system}\s+{re.escape(label)}", out, re.MULTILINE) is not None


@pytest.mark.slow
def test_bench_station_quick_prints_every_figure_and_writes_the_json(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    out = ran("bench_station.py", "--no-peers", "--json", str(path))
    for figure in FIGURES:
        assert shown("macula", figure, out), f"{figure!r} missing from:\n{out}"
    assert "0 dropped" in out
    assert "nats    skipped: --no-peers" in out and "amqtt   skipped: --no-peers" in out
    assert "goals (issue 15)" in out

    document = json.loads(path.read_text())
    assert document["mode"] == "quick"
    assert set(document["skipped"]) == {"nats", "amqtt"}
    assert document["machine_at_start"]["cpus"] >= 1
    ours = document["figures"]["macula"]
    assert set(ours) == OUR_KEYS
    for key, row in ours.items():
        assert set(row) == {"key", "label", "value", "unit", "note"}
        assert row["key"] == key
        assert isinstance(row["value"], float | int) and row["value"] > 0, (key, row)
    assert document["figures"]["aioquic"]["content"]["unit"] == "MiB/s"
    goals = document["goals"]
    assert [g["key"] for g in goals] == [g.key for g in bench_goals.GOALS]
    for goal in goals:
        assert goal["met"] in {"yes", "no", "unknown"}
        if goal["peer"] in {"nats", "amqtt"}:  # skipped: ratio goals cannot be judged
            assert goal["peer_value"] is None
    by_key = {g["key"]: g for g in goals}
    assert by_key["pubsub"]["met"] == "unknown"
    assert by_key["content"]["ratio"] is not None and by_key["content"]["met"] != "unknown"
    assert by_key["idle_kib"]["met"] != "unknown"


def test_bench_station_refuses_a_bad_idle_count() -> None:
    completed = run("bench_station.py", "--idle", "0", quick=False)
    assert completed.returncode == 2
    assert "--idle must be at least 1" in completed.stderr


def figure(key: str, value: float, unit: str = "x") -> Figure:
    return Figure(key, key, value, unit)


def test_goals_are_judged_on_ratios_or_bounds_and_unknown_when_missing() -> None:
    figures = {
        "macula": {
            "pubsub": figure("pubsub", 12_000.0),
            "fanout": figure("fanout", 5_000.0),
            "rpc_p50": figure("rpc_p50", 1_000.0),
            "connect_p50": figure("connect_p50", 4.0),
            "content": figure("content", 7.0),
            "idle_kib": figure("idle_kib", 80.0),
            "tools_list_full": figure("tools_list_full", 30_000.0),
            "tools_list_terse": figure("tools_list_terse", float("nan")),
        },
        "amqtt": {"pubsub": figure("pubsub", 10_000.0), "fanout": figure("fanout", 10_000.0)},
        "nats": {"rpc_p50": figure("rpc_p50", 400.0), "connect_p50": figure("connect_p50", 1.0)},
        "aioquic": {"content": figure("content", 0.0)},
    }
    verdicts = {v.key: v for v in bench_goals.judge(figures)}
    assert verdicts["pubsub"].ratio == pytest.approx(1.2) and verdicts["pubsub"].met == "yes"
    assert verdicts["fanout"].met == "no"
    assert verdicts["rpc_p50"].ratio == pytest.approx(2.5) and verdicts["rpc_p50"].met == "yes"
    assert verdicts["rpc_p99"].met == "unknown"  # neither side measured
    # an absolute bound: the peer is shown for scale, the bound applies to ours alone
    assert verdicts["connect_p50"].ratio == pytest.approx(4.0)
    assert verdicts["connect_p50"].met == "yes"
    assert verdicts["content"].met == "unknown"  # a zero peer figure gives no ratio
    assert verdicts["idle_kib"].met == "no"
    assert verdicts["tools_list_full"].met == "yes"
    assert verdicts["tools_list_terse"].met == "unknown"  # NaN is not a measurement


def test_json_turns_a_missing_measurement_into_null(tmp_path: Path) -> None:
    figures = {"macula": {"e2e_p50": figure("e2e_p50", float("nan"))}}
    path = tmp_path / "out.json"
    verdicts = bench_goals.judge(figures)
    bench_goals.write_json(path, "quick", figures, {"nats": "--no-peers"}, verdicts, {})
    document = json.loads(path.read_text())
    assert document["figures"]["macula"]["e2e_p50"]["value"] is None
    assert all(goal["met"] == "unknown" for goal in document["goals"])


@pytest.mark.slow
def test_bench_client_prints_only_client_figures() -> None:
    out = ran("bench_client.py", "--no-nats")
    assert shown("macula", "RPC calls/s, 50 in flight", out)
    assert shown("macula", "publish→deliver p50", out)
    assert "pub/sub 1:1" not in out


def test_bench_station_cpu_runs_every_hot_path() -> None:
    completed = run("bench_station_cpu.py", "--messages", "3", "--rounds", "1", quick=False)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    out = completed.stdout
    for label in ("PUBLISH, 1 subscriber", "PUBLISH, 50 subscribers", "CALL + RESULT forwarded"):
        assert re.search(rf"^{re.escape(label)}\s+[\d.]+ µs/op$", out, re.MULTILINE), out
