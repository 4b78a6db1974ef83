"""``scripts/bench.py``: every subcommand runs end to end on a few operations (the station with
``--quick``: a station on loopback, every figure), and the entry point lists and dispatches them.

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

from support.paths import SCRIPTS

sys.path.insert(0, str(SCRIPTS))

import bench
import bench_goals
from bench_common import Figure

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


def run(command: str, *args: str, quick: bool = True) -> subprocess.CompletedProcess[str]:
    """``bench.py COMMAND [--quick] ARGS`` in a child process."""
    return subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "bench.py"),
            command,
            *(["--quick"] if quick else []),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def ran(command: str, *args: str, quick: bool = True) -> str:
    completed = run(command, *args, quick=quick)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "FAILED" not in completed.stdout, completed.stdout + completed.stderr
    return completed.stdout


def shown(system: str, label: str, out: str) -> bool:
    return re.search(rf"^{system}\s+{re.escape(label)}", out, re.MULTILINE) is not None


@pytest.mark.slow
def test_bench_station_quick_prints_every_figure_and_writes_the_json(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    out = ran("station", "--no-peers", "--json", str(path))
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
    completed = run("station", "--idle", "0", quick=False)
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
    out = ran("client", "--no-nats")
    assert shown("macula", "RPC calls/s, 50 in flight", out)
    assert shown("macula", "publish→deliver p50", out)
    assert "pub/sub 1:1" not in out


def test_bench_station_cpu_runs_every_hot_path() -> None:
    completed = run("station-cpu", "--messages", "3", "--rounds", "1", quick=False)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    out = completed.stdout
    for kind in ("unbound", "bound"):  # other v2 clients, and ours (issue 27: verified once)
        for label in (
            "PUBLISH, 1 subscriber",
            "PUBLISH, 50 subscribers",
            "CALL + RESULT forwarded",
        ):
            line = rf"^{kind}, {re.escape(label)}\s+[\d.]+ µs/op$"
            assert re.search(line, out, re.MULTILINE), out


def test_bench_lists_every_subcommand_and_refuses_an_unknown_one() -> None:
    listed = run("--help", quick=False)
    assert listed.returncode == 0, listed.stderr
    for name in bench.SUBCOMMANDS:
        assert re.search(rf"^  {re.escape(name)}\s", listed.stdout, re.MULTILINE), listed.stdout
    refused = run("no-such-bench", quick=False)
    assert refused.returncode == 2
    assert "unknown subcommand 'no-such-bench'" in refused.stderr


@pytest.mark.parametrize("name", sorted(bench.SUBCOMMANDS))
def test_every_subcommand_parses_its_own_options(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each module imports and has a ``main(argv)``; its help names it as a subcommand."""
    with pytest.raises(SystemExit) as exited:
        bench.main([name, "--help"])
    assert exited.value.code == 0
    assert "usage: bench.py " in capsys.readouterr().out


def test_bench_wire_prints_every_rate() -> None:
    out = ran("wire", "--seconds", "0.01", quick=False)
    for label in (
        "Ed25519 sign alone",
        "PUBLISH (128-byte payload): encode+sign",
        "BLAKE3 of 16 MiB",
        "MCID",
    ):
        assert re.search(rf"^(-- )?{re.escape(label)}.*/s", out, re.MULTILINE), out


def test_bench_cbor_times_every_frame_and_the_vectors() -> None:
    out = ran("cbor", "--rounds", "1", "--iterations", "10", quick=False)
    assert re.search(r"^mean over \d+ frames\s+[\d.]+ /\s+[\d.]+\s+[\d.]+$", out, re.M), out
    assert re.search(r"^cbor: cbor.json vectors \(\d+\): decode [\d.]+ µs", out, re.M), out


def test_bench_station_sig_counts_signatures_and_sends() -> None:
    out = ran("station-sig", "--messages", "3", "--rounds", "1", "--subscribers", "2", quick=False)
    # the station's Ed25519 per PUBLISH: an unbound client's frame verified, a bound one's not;
    # with a peer station subscribed the publisher_sig is verified before the link either way
    for kind, verifies, linked in (("unbound", "1.00", "2.00"), ("bound", "0.00", "1.00")):
        assert re.search(
            rf"^{kind}, 2 subscriber\(s\)\s+[\d.]+ µs/msg\s+sign 1.00"
            rf"\s+verify {verifies}\s+sends 2$",
            out,
            re.M,
        ), out
        assert re.search(
            rf"^{kind}, 2 subscriber\(s\) \+ 1 peer station .* verify {linked}\s+sends 3$",
            out,
            re.M,
        ), out


def test_bench_client_path_prints_cpu_per_operation() -> None:
    out = ran("client-path", "--n", "20", "--only", "publish", "--only", "deliver", quick=False)
    keys = re.findall(r"^(\w+)\s+[\d.]+", out, re.M)
    assert any(key.startswith("publish") for key in keys), out
    assert any(key.startswith("deliver") for key in keys), out


def test_bench_profile_sums_self_time_by_area(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks.txt"
    stacks.write_text(
        "main;macula/node/node.py:publish;relay/core/router.py:route 3\nmain;aioquic/x.py:send 1\n"
    )
    out = ran("profile", str(stacks), "--top", "2", quick=False)
    assert "4 busy samples (0 waiting left out)" in out, out
    assert " 75.0%  relay/core/router.py:route" in out, out


@pytest.mark.slow
def test_bench_content_cpu_and_backend_cpu_print_one_json_line_each() -> None:
    content = json.loads(ran("content-cpu", "--mib", "0.25", "--rounds", "1", quick=False))
    assert content["client_ms_per_mib"] > 0 and content["station_ms_per_mib"] > 0, content
    backend = json.loads(
        ran("backend-cpu", "--messages", "50", "--content-mib", "0.25", quick=False)
    )
    assert backend["pubsub"]["messages"] == 50 and backend["content"]["cpu_ms_per_mib"] > 0


def test_bench_mesh_times_three_stations_linking() -> None:
    out = ran("mesh", "--runs", "1", quick=False)
    assert re.search(
        r"^mesh: three stations linked pairwise after start in p50 [\d.]+ s", out, re.M
    )


@pytest.mark.slow
def test_bench_agent_times_say_to_wait_through_two_real_mcp_servers(tmp_path: Path) -> None:
    """Two ``macula-mcp`` on stdio and a station process: every message said is the one the
    other's wait returned (the bench checks the id), with the CPU of each process."""
    out_json = tmp_path / "agent.json"
    out = ran("agent", "--json", str(out_json))
    assert "say → wait returned" in out and "goal p50 <= 6.0 ms" in out, out
    figures = json.loads(out_json.read_text())
    assert figures["messages"] == 20
    assert 0 < figures["say_to_wait_ms"]["p50"] <= figures["say_to_wait_ms"]["p99"]
    assert set(figures["cpu_ms_per_message"]) == {"station", "agent_a", "agent_b", "driver"}


@pytest.mark.slow
def test_bench_agent_compares_the_audit_trail_on_and_off(tmp_path: Path) -> None:
    """``--audit both``: a pair with the trail and a pair without, interleaved, both figures
    and the change of the p50."""
    out_json = tmp_path / "audit.json"
    out = ran("agent", "--audit", "both", "--json", str(out_json))
    assert "say → wait, audit off" in out and "audit trail on vs off: p50" in out, out
    figures = json.loads(out_json.read_text())
    assert set(figures["say_to_wait_ms"]) == {"off", "on"} and figures["messages"] == 20
    assert isinstance(figures["p50_change_percent"], float)


@pytest.mark.slow
def test_bench_agent_presence_counts_every_hello_seen(tmp_path: Path) -> None:
    out_json = tmp_path / "presence.json"
    ran("agent", "--presence", "--json", str(out_json))
    figures = json.loads(out_json.read_text())
    assert figures["agents"] == 20 and figures["arrival_hellos_lost"] == 0
    assert figures["hello_to_seen_arrival_ms"]["samples"] == (20 - 2) * 2  # 2 listeners
    assert figures["station_cpu_percent_steady"] >= 0
    assert figures["udp_receive_drops_arrival"] >= 0 and len(figures["load_average_1min"]) == 2


def test_bench_search_times_queries_and_say_to_wait_with_and_without_the_index(
    tmp_path: Path,
) -> None:
    """A small store searched through ``macula.agent.search``, and say → wait through two real
    ``macula-mcp`` once with the index's triggers and once without them."""
    out_json = tmp_path / "search.json"
    out = ran("search", "--json", str(out_json))
    assert "query over 2,000 messages" in out and "goal p50 <= 20.0 ms" in out, out
    assert "indexing on" in out and "indexing off" in out, out
    figures = json.loads(out_json.read_text())
    assert figures["query"]["queries"] == 30
    assert 0 < figures["query"]["p50_ms"] <= figures["query"]["p99_ms"]
    assert len(figures["say_wait"]["say_wait_p50_on_ms"]) == 1
