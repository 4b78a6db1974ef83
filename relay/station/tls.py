"""The station's TLS certificate (PROTOCOL.md §1.2): self-signed over its own Ed25519 key.

The certificate's public key *is* the station's node id, so a client that knows the node id
can pin it without any PKI. Subject CN ``Macula Identity``; SAN lists every configured host name
and IP address (a CA-verifying client needs one that matches the dialled name); validity now ..
now + 3650 days. Written once into the data directory (0600) and regenerated when the SANs or
the key no longer match.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import NameOID

from macula.private_file import write_private
from macula.wire.identity import Identity

VALIDITY = datetime.timedelta(days=3650)


def _san_entries(hosts: list[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def build_certificate(identity: Identity, hosts: list[str], now: datetime.datetime) -> bytes:
    """PEM of a self-signed certificate over ``identity``'s key with ``hosts`` as SANs."""
    key = Ed25519PrivateKey.from_private_bytes(identity.seed)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Macula Identity")])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(_san_entries(hosts)), False)
    certificate = builder.sign(key, None)
    return certificate.public_bytes(serialization.Encoding.PEM)


def private_key_pem(identity: Identity) -> bytes:
    key = Ed25519PrivateKey.from_private_bytes(identity.seed)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _certificate_fits(
    pem: bytes, identity: Identity, hosts: list[str], now: datetime.datetime
) -> bool:
    try:
        certificate = x509.load_pem_x509_certificate(pem)
    except ValueError:
        return False
    key = certificate.public_key()
    if not isinstance(key, Ed25519PublicKey):
        return False
    if (
        key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        != identity.node_id
    ):
        return False
    if (
        not certificate.not_valid_before_utc
        <= now
        < certificate.not_valid_after_utc - datetime.timedelta(days=30)
    ):
        return False
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return not hosts
    return set(map(str, san)) == set(map(str, _san_entries(hosts)))


def ensure_certificate(data_dir: Path, identity: Identity, hosts: list[str]) -> tuple[Path, Path]:
    """Paths of the station's certificate and key PEM files, (re)written when needed."""
    cert_path = data_dir / "station-cert.pem"
    key_path = data_dir / "station-key.pem"
    now = datetime.datetime.now(datetime.UTC)
    fits = cert_path.exists() and key_path.exists()
    if fits and _certificate_fits(cert_path.read_bytes(), identity, hosts, now):
        return cert_path, key_path
    write_private(key_path, private_key_pem(identity))
    write_private(cert_path, build_certificate(identity, hosts, now))
    return cert_path, key_path
