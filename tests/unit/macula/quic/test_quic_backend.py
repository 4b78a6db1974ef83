"""The QUIC backend and event-loop choices (``MACULA_QUIC``, ``MACULA_LOOP``): defaults, forced
choices, bad values, a forced choice that is not installed, and the two adapters that read the
peer certificate and the unsent bytes of a stream on either library."""

from __future__ import annotations

import asyncio
import datetime
import importlib.util
import subprocess
import sys
import warnings
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from macula.errors import ConfigError
from macula.quic import backend as quic_backend
from macula.quic import event_loop
from macula.quic.backend import QuicBackendError, chosen, peer_certificate, unsent_bytes
from macula.quic.event_loop import EventLoopError, loop_factory, loop_name
from macula.wire.identity import Identity
from relay.station.tls import build_certificate

HAS_UVLOOP = importlib.util.find_spec("uvloop") is not None


# --- MACULA_QUIC ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, "aioquic"), ("", "aioquic"), ("aioquic", "aioquic"), (" QH3 ", "qh3")],
)
def test_the_quic_choice_defaults_to_aioquic_and_honours_the_setting(
    value: str | None, expected: str
) -> None:
    environ = {} if value is None else {"MACULA_QUIC": value}
    assert chosen(environ) == expected


@pytest.mark.parametrize("value", ["quiche", "aioquic,qh3", "1"])
def test_an_unknown_quic_choice_is_a_config_error_naming_the_setting(value: str) -> None:
    with pytest.raises(QuicBackendError, match="MACULA_QUIC") as caught:
        chosen({"MACULA_QUIC": value})
    assert isinstance(caught.value, ConfigError)


def _import_backend(env_value: str, hide: str | None) -> subprocess.CompletedProcess[str]:
    hiding = f"sys.modules[{hide!r}] = None;" if hide else ""
    code = f"import sys; {hiding} import macula.quic.backend as b; print(b.BACKEND)"
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"MACULA_QUIC": env_value, "PATH": ""},
    )


def test_qh3_forced_but_not_installed_fails_at_import_with_the_fix() -> None:
    done = _import_backend("qh3", hide="qh3")
    assert done.returncode != 0
    assert "QuicBackendError" in done.stderr
    assert "macula-mesh[fast]" in done.stderr


def test_the_default_backend_is_aioquic_even_when_qh3_is_importable() -> None:
    done = _import_backend("", hide=None)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "aioquic"


def test_the_process_reports_the_backend_it_runs() -> None:
    described = quic_backend.describe()
    assert described["quic"] == quic_backend.BACKEND
    assert described["version"]


# --- the adapters --------------------------------------------------------------------------


def _certificate() -> tuple[Identity, x509.Certificate]:
    identity = Identity(bytes(range(32)))
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    pem = build_certificate(identity, ["localhost"], now)
    return identity, x509.load_pem_x509_certificate(pem)


class _NativeCertificate:
    """What qh3 keeps: its own parsed certificate whose ``public_bytes()`` is the DER."""

    def __init__(self, der: bytes) -> None:
        self._der = der

    def public_bytes(self) -> bytes:
        return self._der


def _quic(**attributes: Any) -> Any:
    return SimpleNamespace(**attributes)


def test_the_peer_certificate_reads_an_aioquic_and_a_qh3_certificate_alike() -> None:
    identity, certificate = _certificate()
    der = certificate.public_bytes(Encoding.DER)
    from_aioquic = peer_certificate(_quic(tls=_quic(_peer_certificate=certificate)))
    from_qh3 = peer_certificate(_quic(tls=_quic(_peer_certificate=_NativeCertificate(der))))
    assert from_aioquic is certificate
    assert from_qh3 is not None
    assert from_qh3.public_bytes(Encoding.DER) == der
    raw = from_qh3.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert raw == identity.node_id  # what the client pins


@pytest.mark.parametrize(
    "tls",
    [
        None,
        _quic(),
        _quic(_peer_certificate=None),
        _quic(_peer_certificate=_NativeCertificate(b"x")),
    ],
)
def test_no_or_a_garbled_peer_certificate_reads_as_none(tls: Any) -> None:
    assert peer_certificate(_quic(tls=tls)) is None


def test_unsent_bytes_on_aioquic_counts_past_the_highest_sent_offset() -> None:
    stream = _quic(sender=_quic(highest_offset=300))
    quic = _quic(_streams={4: stream})
    assert unsent_bytes(quic, 4, 1000) == 700
    assert unsent_bytes(quic, 4, 200) == 0  # never negative
    assert unsent_bytes(quic, 8, 1000) is None  # a stream aioquic forgot


class _NativeQuic:
    """qh3's facade: no ``_streams``; the native core counts bytes still waiting."""

    def __init__(self, queued: dict[int, int]) -> None:
        self.queued = queued

    def _stream_can_send(self, stream_id: int) -> bool:
        return stream_id in self.queued

    def get_send_buffer_size(self, stream_id: int | None = None) -> int:
        assert stream_id is not None
        return self.queued[stream_id]


def test_unsent_bytes_on_qh3_is_what_its_core_still_holds() -> None:
    quic: Any = _NativeQuic({0: 4096})
    assert unsent_bytes(quic, 0, 10_000) == 4096
    assert unsent_bytes(quic, 4, 10_000) is None


# --- MACULA_LOOP ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "", "auto", "AUTO"])
def test_the_loop_defaults_to_uvloop_when_installed(value: str | None) -> None:
    environ = {} if value is None else {"MACULA_LOOP": value}
    assert loop_name(environ) == ("uvloop" if HAS_UVLOOP else "asyncio")


def test_the_loop_can_be_forced_to_asyncio() -> None:
    assert loop_factory({"MACULA_LOOP": "asyncio"}) is None


@pytest.mark.parametrize("value", ["libuv", "0", "uvloop asyncio"])
def test_an_unknown_loop_is_a_config_error(value: str) -> None:
    with pytest.raises(EventLoopError, match="MACULA_LOOP") as caught:
        loop_factory({"MACULA_LOOP": value})
    assert isinstance(caught.value, ConfigError)


def test_uvloop_forced_but_not_installed_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    assert loop_factory({}) is None  # auto: asyncio's loop, quietly
    with pytest.raises(EventLoopError, match=r"macula-mesh\[fast\]"):
        loop_factory({"MACULA_LOOP": "uvloop"})


async def _loop_module() -> str:
    await asyncio.sleep(0)  # a real await: this runs on whichever loop the test started
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


def test_run_uses_the_selected_loop() -> None:
    assert event_loop.run(_loop_module(), {"MACULA_LOOP": "asyncio"}) == "asyncio"
    assert event_loop.run(_loop_module(), {}) == ("uvloop" if HAS_UVLOOP else "asyncio")


def test_run_with_a_bad_setting_leaves_no_unawaited_coroutine() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a "never awaited" RuntimeWarning would fail here
        coroutine = _loop_module()
        with pytest.raises(EventLoopError):
            event_loop.run(coroutine, {"MACULA_LOOP": "nope"})
    assert coroutine.cr_frame is None  # closed
