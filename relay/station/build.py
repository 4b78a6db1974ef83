"""How a station's parts are made, one function per part, each closer registered on the start's
``AsyncExitStack`` the moment its part opens (``relay.station.station.Station`` calls them in
order).

The data dir (0700) with the station key and certificate, the realm rules and the allowlist,
the record and content stores, the built-ins, the router core, the QUIC server on its socket,
the DHT among stations, the house services and the known peer stations.
Nothing here keeps state: what a function makes it returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from macula.clock import now_ms
from macula.keyfile import load_or_create_identity
from macula.quic.backend import QuicConfiguration, QuicServer
from macula.quic.datagrams import bound_socket, open_draining
from macula.quic.resets import StatelessResets
from macula.quic.transport import (
    ALPN,
    CONNECTION_WINDOW,
    IDLE_TIMEOUT_S,
    STREAM_WINDOW,
    FrameProtocol,
    datagram_size,
    enlarge_receive_buffer,
)
from macula.services.house import HOUSE_REALM
from macula.task_scope import Spawner
from macula.wire.frames import Publish
from macula.wire.identity import Identity
from relay.builtins.procedures import Builtins
from relay.core.actions import StationReplied
from relay.core.router import RouterCore
from relay.federation.content import peer_asker
from relay.federation.dht.station import StationDht
from relay.federation.known_peers import FILE_NAME as KNOWN_PEERS_FILE
from relay.federation.known_peers import KnownPeers
from relay.federation.links import LinkTarget
from relay.house.mesh import linked_asker
from relay.house.services import HouseServices
from relay.realms.admission import AdmissionMode, ConnectRule
from relay.realms.gate import RealmGate
from relay.realms.links import own_station_endorsements
from relay.station.config import StationConfig
from relay.station.quic_server import StationQuicServer
from relay.station.realm_files import Allowlist
from relay.station.tls import ensure_certificate
from relay.stores.records import ContentStore, RecordStore

log = logging.getLogger("macula.relay")

CallStation = Callable[..., Coroutine[Any, Any, StationReplied]]


def identity_and_certificate(config: StationConfig) -> tuple[Identity, Path, Path]:
    """The data dir (0700), the station's key and its certificate (made on first start)."""
    data_dir = config.data_dir
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700)
    identity = load_or_create_identity(data_dir / "station.key")
    hosts = list(dict.fromkeys([*config.advertised_hosts, config.host, "localhost"]))
    cert_path, key_path = ensure_certificate(data_dir, identity, hosts)
    return identity, cert_path, key_path


def realm_rules(config: StationConfig) -> tuple[RealmGate, ConnectRule, Allowlist | None]:
    """The realms this station protects and who may connect (``ValueError`` if the
    admission mode lacks what it needs; ``AllowlistError`` for a bad allowlist file)."""
    policy, mode = config.policy, config.admission
    if mode is AdmissionMode.ALLOWLIST and config.allowlist is None:
        raise ValueError("admission 'allowlist' needs an allowlist file")
    if mode is AdmissionMode.MEMBERS and not config.realms:
        raise ValueError("admission 'members' needs at least one protected realm")
    gate = RealmGate.protecting(
        config.realms,
        sweep_ms=policy.realm_sweep_ms,
        max_presented=policy.max_presented_endorsements,
        max_revocations=policy.max_realm_revocations,
    )
    allowlist = None if config.allowlist is None else Allowlist.load(config.allowlist)
    stations = frozenset(target.node_id for target in [*config.peers, *config.siblings])
    return gate, ConnectRule(mode, allowlist, stations), allowlist


async def open_records(data_dir: Path, stack: contextlib.AsyncExitStack) -> RecordStore:
    records = await RecordStore.open(data_dir / "records.sqlite3")
    stack.push_async_callback(records.close)
    return records


async def open_content(data_dir: Path, stack: contextlib.AsyncExitStack) -> ContentStore:
    content = await ContentStore.open(data_dir / "content.sqlite3")
    stack.push_async_callback(content.close)
    return content


def builtins_for(
    config: StationConfig,
    identity: Identity,
    stores: tuple[RecordStore, ContentStore],
    core: RouterCore,
    dht: StationDht,
    call_station: CallStation,
) -> Builtins:
    """The built-ins (§6.6) on the stores, stored puts also put into the DHT among stations;
    content missing here is asked of linked stations."""
    policy = config.policy
    return Builtins(
        *stores,
        station_id=identity.node_id,
        limits=config.store_limits,
        max_clock_skew_ms=policy.max_clock_skew_ms,
        dht=dht,
        ask_peers=peer_asker(
            core.linked_stations,
            call_station,
            fanout=policy.content_fanout,
            timeout_s=policy.content_fetch_timeout_ms / 1000,
        ),
        on_stored=lambda record, now: core.realms.learn(record, now),
    )


def router_for(
    config: StationConfig,
    identity: Identity,
    rules: tuple[RealmGate, ConnectRule],
    open_stream: Callable[[int], int],
    published: Callable[[Publish, int, bool], None],
) -> RouterCore:
    realms, connect_rule = rules
    return RouterCore(
        identity,
        config.policy,
        open_stream=open_stream,
        random_bytes=os.urandom,
        services=HouseServices.keys_for(config.house),
        realms=realms,
        connect_rule=connect_rule,
        station_endorsements=own_station_endorsements(  # ValueError: not started
            config.station_endorsements, identity.node_id, realms.realms, now_ms()
        ),
        published=published,  # the room history's feed, once the house is open
    )


def stateless_resets(identity: Identity) -> StatelessResets:
    """The station's stateless resets: tokens from its key, so its next process makes the same
    ones and answers its previous run's connections with resets they recognise."""
    return StatelessResets(identity.seed, os.urandom)


async def bind_quic(config: StationConfig, stack: contextlib.AsyncExitStack) -> socket.socket:
    """The UDP socket of the QUIC server, bound on ``config.host:config.port`` (0: any free
    port; its port is known from here on) and closed by ``stack``; nothing reads it until
    ``serve_quic``, so no datagram reaches the station before its parts are open."""
    sock = await bound_socket(config.host, config.port, reuse_port=config.reuse_port)
    stack.callback(sock.close)
    return sock


async def serve_quic(
    config: StationConfig,
    certificate: tuple[Path, Path],
    protocol: Callable[..., FrameProtocol],
    retry: bool,
    resets: StatelessResets | None = None,
    sock: socket.socket | None = None,
) -> tuple[QuicServer, int]:
    """The QUIC server on ``sock`` (none: one bound on ``config.host:config.port``, 0: any
    free port) and its port; the caller registers its closing at once. With ``resets`` it
    answers packets of connections it does not know (a previous run's) with stateless
    resets."""
    quic = QuicConfiguration(
        is_client=False,
        alpn_protocols=[ALPN],
        idle_timeout=IDLE_TIMEOUT_S,
        max_data=CONNECTION_WINDOW,
        max_stream_data=STREAM_WINDOW,
    )
    quic.max_datagram_size = datagram_size(config.host)  # larger when bound on loopback
    quic.load_cert_chain(*certificate)
    # aioquic's ``serve`` with a socket of our own, so the server reads every datagram
    # waiting at each readiness (macula.quic.datagrams), not one per loop turn
    server = StationQuicServer(
        configuration=quic, create_protocol=protocol, retry=retry, resets=resets
    )
    if sock is None:
        sock = await bound_socket(config.host, config.port, reuse_port=config.reuse_port)
    await open_draining(sock, server)
    enlarge_receive_buffer(sock)
    return server, int(sock.getsockname()[1])


async def serve_sibling_links(
    config: StationConfig,
    certificate: tuple[Path, Path],
    protocol: Callable[..., FrameProtocol],
    stack: contextlib.AsyncExitStack,
    resets: StatelessResets | None = None,
) -> None:
    """A worker's second QUIC listener, on 127.0.0.1:``link_port``, where the other workers
    dial it (the shared port would hash a dial to any worker); none without ``link_port``."""
    if config.link_port is None:
        return
    sibling = dataclasses.replace(
        config, host="127.0.0.1", port=config.link_port, reuse_port=False, link_port=None
    )
    server, _ = await serve_quic(sibling, certificate, protocol, retry=False, resets=resets)
    stack.callback(server.close)


async def start_dht(
    config: StationConfig,
    identity: Identity,
    quic_port: int,
    stack: contextlib.AsyncExitStack,
    spawn: Spawner,
) -> StationDht:
    """The DHT among stations on UDP ``dht_port`` (None: the QUIC port + 1, or any free port
    when that is 0)."""
    port = config.dht_port
    if port is None:
        port = config.port + 1 if 0 < config.port < 0xFFFF else 0
    hosts = [*config.advertised_hosts, config.host]
    dht = StationDht(identity, quic_port=quic_port, hosts=hosts, config=config.dht, spawn=spawn)
    try:
        bound = await dht.start(config.host, port)
    except OSError as exc:
        raise OSError(exc.errno, f"DHT udp port {port}: {exc.strerror}") from exc
    stack.push_async_callback(dht.stop)
    log.info("DHT listening on udp %s:%d", config.host, bound)
    return dht


async def open_house(
    config: StationConfig,
    identity: Identity,
    quic_port: int,
    linked: Callable[[], list[bytes]],
    call_station: CallStation,
    stack: contextlib.AsyncExitStack,
    spawn: Spawner,
) -> HouseServices:
    """The house services; those of linked stations are asked in the house realm."""
    house = await HouseServices.open(
        config.house,
        config.data_dir,
        identity.node_id,
        config.host,
        quic_port,
        ask_linked=linked_asker(
            linked,
            lambda node_id, procedure, payload, timeout_s: call_station(
                node_id, procedure, payload, timeout_s, realm=HOUSE_REALM
            ),
            fanout=config.house.mesh_fanout,
            concurrency=config.house.mesh_concurrency,
            timeout_s=config.house.mesh_timeout_ms / 1000,
        ),
        spawn=spawn,
    )
    stack.push_async_callback(house.close)
    return house


def known_peers_for(
    config: StationConfig, identity: Identity
) -> tuple[KnownPeers, list[LinkTarget]]:
    """The stations remembered in the data dir, and those of them not named by ``peers``."""
    known = KnownPeers(
        config.data_dir / KNOWN_PEERS_FILE,
        identity.node_id,
        max_count=config.known_peers_max,
        clock=now_ms,
    )
    named = {target.node_id for target in config.peers}
    remembered = [t for t in known.load() if t.node_id not in named]
    if remembered:
        log.info("dialling %d stations remembered from before", len(remembered))
    return known, remembered
