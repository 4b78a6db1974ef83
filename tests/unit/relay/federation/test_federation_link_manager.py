"""``LinkManager`` (which stations to dial, when to dial again) and ``--peer`` parsing.

The link itself is a fake ``run_link``; sleep, clock and jitter are injected, so backoff is
read off the recorded sleeps, never waited for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from relay.federation.links import LinkFailed, LinkManager, LinkTarget, parse_peer
from relay.ops.cli import build_parser, config_from_args
from support.waiting import eventually

ME = bytes([1]) * 32
P1, P2, P3 = (LinkTarget(bytes([n]) * 32, "127.0.0.1", 4000 + n) for n in (2, 3, 4))


class Fake:
    """A fake network: ``run_link`` fails or 'holds' a link; sleeps are recorded."""

    def __init__(self, fail: bool = True, hold_s: float = 0.0) -> None:
        self.dialled: list[bytes] = []
        self.sleeps: list[float] = []
        self.now = 0.0
        self.fail = fail
        self.hold_s = hold_s
        self.links: set[bytes] = set()
        self.progress = asyncio.Event()

    async def run_link(self, target: LinkTarget) -> None:
        self.dialled.append(target.node_id)
        self.progress.set()
        if self.fail:
            raise ConnectionRefusedError("nothing listens there")
        self.now += self.hold_s  # the link stayed up this long, then was lost

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await asyncio.sleep(0)  # the injected sleep: recorded, not waited; one loop turn

    def manager(self, **kw: object) -> LinkManager:
        defaults: dict[str, object] = {
            "run_link": self.run_link,
            "has_link": lambda node: node in self.links,
            "sleep": self.sleep,
            "clock": lambda: self.now,
            "jitter": lambda: 1.0,
        }
        defaults.update(kw)
        return LinkManager(ME, **defaults)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_failed_dials_back_off_exponentially_up_to_the_cap() -> None:
    fake = Fake()
    links = fake.manager(peers=[P1], backoff_base_s=0.5, backoff_max_s=4.0)
    links.start()
    await eventually(lambda: len(fake.sleeps) >= 6, interval=0)
    await links.stop()
    assert fake.sleeps[:6] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert set(fake.dialled) == {P1.node_id}


@pytest.mark.anyio
async def test_jitter_spreads_the_delay_between_half_and_all_of_it() -> None:
    fake = Fake()
    links = fake.manager(jitter=lambda: 0.0, backoff_base_s=1.0, backoff_max_s=8.0)
    assert [links.backoff(n) for n in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert fake.manager(backoff_base_s=1.0).backoff(100) == 30.0  # the default cap, no overflow


@pytest.mark.anyio
async def test_a_link_that_stayed_up_redials_without_growing_backoff() -> None:
    fake = Fake(fail=False, hold_s=60.0)
    links = fake.manager(peers=[P1], backoff_base_s=0.5, stable_s=10.0)
    links.start()
    await eventually(lambda: len(fake.sleeps) >= 4, interval=0)
    await links.stop()
    assert fake.sleeps[:4] == [0.5, 0.5, 0.5, 0.5]


@pytest.mark.anyio
async def test_never_itself_never_twice_and_at_most_max_links() -> None:
    fake = Fake()
    own = LinkTarget(ME, "127.0.0.1", 1)
    links = fake.manager(peers=[own, P1, P1, P2, P3], max_links=2)
    links.start()
    await eventually(lambda: {P1.node_id, P2.node_id} <= set(fake.dialled), interval=0)
    await links.stop()
    assert set(fake.dialled) == {P1.node_id, P2.node_id}


@pytest.mark.anyio
async def test_a_station_already_linked_is_not_dialled() -> None:
    fake = Fake()
    fake.links.add(P1.node_id)  # it dialled us
    links = fake.manager(peers=[P1], backoff_max_s=7.0)
    links.start()
    await eventually(lambda: len(fake.sleeps) >= 3, interval=0)
    assert fake.dialled == [] and fake.sleeps[:3] == [7.0, 7.0, 7.0]
    fake.links.clear()  # that link is lost: now this station dials
    await eventually(lambda: fake.dialled == [P1.node_id], interval=0)
    await links.stop()


@pytest.mark.anyio
async def test_discovery_adds_stations_and_drops_the_ones_it_no_longer_names() -> None:
    fake = Fake()
    rounds: list[Sequence[LinkTarget]] = [[P1, P2], [P2]]

    async def discover() -> Sequence[LinkTarget]:
        return rounds.pop(0) if len(rounds) > 1 else rounds[0]

    links = fake.manager(peers=[P3], discover=discover, discover_interval_s=1.0)
    links.start()
    await eventually(lambda: {P1.node_id, P2.node_id, P3.node_id} <= set(fake.dialled), interval=0)
    await eventually(lambda: P1.node_id not in links.targets, interval=0)
    assert set(links.targets) == {P2.node_id, P3.node_id}  # --peer entries stay
    await links.stop()


@pytest.mark.anyio
async def test_a_failing_discovery_is_retried() -> None:
    fake = Fake()
    calls = 0

    async def discover() -> Sequence[LinkTarget]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("dht not ready")
        return [P1]

    links = fake.manager(discover=discover)
    links.start()
    await eventually(lambda: P1.node_id in fake.dialled, interval=0)
    await links.stop()


@pytest.mark.anyio
async def test_halt_stops_redialling_and_stop_ends_every_task() -> None:
    fake = Fake()
    links = fake.manager(peers=[P1, P2])
    links.start()
    await eventually(lambda: len(fake.dialled) >= 2, interval=0)
    links.halt()
    await eventually(lambda: not links._tasks, interval=0)
    dialled = len(fake.dialled)
    await links.stop()
    await asyncio.sleep(0)  # one loop turn: a dial scheduled after stop would have started
    assert len(fake.dialled) == dialled and links.targets == {}


@pytest.mark.anyio
async def test_an_unexpected_error_does_not_end_the_redialling() -> None:
    fake = Fake()
    seen = 0

    async def flaky(target: LinkTarget) -> None:
        nonlocal seen
        seen += 1
        raise RuntimeError("bug") if seen == 1 else LinkFailed("wrong key")

    links = fake.manager(peers=[P1], run_link=flaky)
    links.start()
    await eventually(lambda: seen >= 3, interval=0)
    await links.stop()


# --- --peer ---------------------------------------------------------------------------------


def test_a_peer_is_node_id_at_host_and_port() -> None:
    node = "ab" * 32
    assert parse_peer(f"{node}@example.org:4433") == LinkTarget(
        bytes.fromhex(node), "example.org", 4433
    )
    assert parse_peer(f"{node}@[::1]:7") == LinkTarget(bytes.fromhex(node), "::1", 7)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "nohost",
        "ab@h:1",
        f"{'zz' * 32}@h:1",
        f"{'ab' * 32}@h",
        f"{'ab' * 32}@:1",
        f"{'ab' * 32}@h:0",
        f"{'ab' * 32}@h:65536",
        f"{'ab' * 32}@h:x",
    ],
)
def test_a_malformed_peer_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ValueError, match=r"NODE_ID|hex|port|HOST"):
        parse_peer(bad)


def test_the_cli_takes_peers_and_max_links(capsys: pytest.CaptureFixture[str]) -> None:
    node = "cd" * 32
    args = build_parser().parse_args(
        ["--peer", f"{node}@a:1", "--peer", f"{node}@b:2", "--max-links", "3"]
    )
    config = config_from_args(args)
    assert [p.host for p in config.peers] == ["a", "b"] and config.max_links == 3
    assert config_from_args(build_parser().parse_args([])).max_links == 64
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--peer", "oops"])
    assert exit_info.value.code == 2
    assert "--peer" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--max-links", "0"])
    assert exit_info.value.code == 2


@pytest.mark.anyio
async def test_stations_a_link_names_are_dialled_at_once_never_itself_or_twice() -> None:
    fake = Fake()
    fake.links.add(P3.node_id)  # already linked: not dialled again
    links = fake.manager(peers=[P1], max_links=3)
    links.start()
    own = LinkTarget(ME, "127.0.0.1", 1)
    assert links.learn([own, P1, P2, P2, P3]) == 1  # P1 is a target already
    await eventually(lambda: P2.node_id in fake.dialled, interval=0)
    assert set(links.targets) == {P1.node_id, P2.node_id}
    await links.stop()
    assert links.learn([P3]) == 0  # stopped: nothing new is dialled


@pytest.mark.anyio
async def test_a_learned_station_outlives_a_discovery_round_that_does_not_name_it_yet() -> None:
    fake = Fake()
    rounds = 0

    async def discover() -> Sequence[LinkTarget]:
        nonlocal rounds
        rounds += 1
        return []  # the DHT does not know the learned station (yet)

    links = fake.manager(discover=discover, discover_interval_s=10.0)
    links.start()
    links.learn([P1])
    await eventually(lambda: rounds >= 3, interval=0)  # rounds run while the clock stands still
    assert P1.node_id in links.targets  # learned less than an interval ago: kept
    fake.now = 11.0  # a discovery interval later, still not named and not linked: dropped
    await eventually(lambda: P1.node_id not in links.targets, interval=0)
    await links.stop()


@pytest.mark.anyio
async def test_learning_stops_at_max_links() -> None:
    fake = Fake()
    links = fake.manager(peers=[P1], max_links=2)
    links.start()
    assert links.learn([P2, P3]) == 1
    assert set(links.targets) == {P1.node_id, P2.node_id}
    await links.stop()


@pytest.mark.anyio
async def test_a_station_told_of_a_newcomer_waits_and_does_not_dial_once_linked() -> None:
    fake = Fake()
    links = fake.manager()
    links.start()
    assert links.learn([P1, P2], after_s=2.0) == 2
    fake.links.add(P1.node_id)  # during the wait the newcomer P1 dialled this station
    await eventually(lambda: P2.node_id in fake.dialled, interval=0)
    assert fake.sleeps[:2] == [2.0, 2.0]  # each waited first
    await eventually(lambda: len(fake.sleeps) >= 6, interval=0)
    await links.stop()
    assert P1.node_id not in fake.dialled  # linked by its own dial: never dialled from here
