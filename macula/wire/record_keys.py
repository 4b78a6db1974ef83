"""Storage keys of DHT records (PROTOCOL.md §10.5): pure functions of their inputs.

Invariants:
- Every key is 32 bytes: the signer's key itself, or SHA-256 of the rule's inputs (most behind
  a fixed ASCII label), concatenated with no separators or length prefixes (§10.5).
- Inputs are checked exactly (a 32-byte key, a 34-byte MCID, text or bytes for a name); a wrong
  one is a ``LocalProtocolError("bad_argument")``, never a silently different key.
- Which rule a stored ``Record`` uses is ``Record.storage_key`` (``macula.wire.records``); the
  rules whose inputs no payload field carries are only reachable from here.
"""

from __future__ import annotations

import hashlib
from typing import Final

from macula.wire.content import MCID_SIZE
from macula.wire.errors import LocalProtocolError

KEY_SIZE: Final = 32  # node, station and realm ids, and every storage key
DOMAIN_TYPE_MIN: Final = 0x20


def is_domain_type(record_type: int) -> bool:
    """0x20..0xFF: application-defined types, keyed by signer (and ``subject_id``)."""
    return DOMAIN_TYPE_MIN <= record_type <= 0xFF


def _sha256(*parts: bytes) -> bytes:
    return hashlib.sha256(b"".join(parts)).digest()


def _exact(value: object, size: int, what: str) -> bytes:
    if type(value) is not bytes or len(value) != size:
        raise LocalProtocolError("bad_argument", f"{what} must be {size} bytes")
    return value


def _name_bytes(value: object, what: str) -> bytes:
    if type(value) is bytes:
        return value
    if type(value) is str:
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:
            raise LocalProtocolError("bad_argument", f"{what} is not valid UTF-8") from None
    raise LocalProtocolError("bad_argument", f"{what} must be text or bytes")


def signer_storage_key(key: bytes) -> bytes:
    """0x01 node_record, 0x03 realm_directory, 0x0C tombstone, domain types without ``u``."""
    return _exact(key, KEY_SIZE, "key")


def storage_key_for_procedure(procedure_uri: str) -> bytes:
    """0x06 procedure_advertisement: SHA-256(UTF-8 procedure_uri)."""
    return _sha256(_name_bytes(procedure_uri, "procedure_uri"))


def realm_stations_key(realm: bytes) -> bytes:
    """0x04 realm_stations: SHA-256("station_set" || realm id)."""
    return _sha256(b"station_set", _exact(realm, KEY_SIZE, "realm"))


def member_endorsement_key(realm: bytes, member_node: bytes) -> bytes:
    """0x05 realm_member_endorsement: SHA-256("member_endorsement" || realm || member_node)."""
    return _sha256(
        b"member_endorsement",
        _exact(realm, KEY_SIZE, "realm"),
        _exact(member_node, KEY_SIZE, "member_node"),
    )


def foundation_seed_list_key(key: bytes) -> bytes:
    """0x0D foundation_seed_list: SHA-256("foundation_seed_list" || key)."""
    return _sha256(b"foundation_seed_list", _exact(key, KEY_SIZE, "key"))


def foundation_parameter_key(key: bytes, param_name: str | bytes) -> bytes:
    """0x0E foundation_parameter: SHA-256("foundation_parameter" || key || param_name)."""
    return _sha256(
        b"foundation_parameter",
        _exact(key, KEY_SIZE, "key"),
        _name_bytes(param_name, "param_name"),
    )


def foundation_realm_trust_list_key(key: bytes) -> bytes:
    """0x0F foundation_realm_trust_list: SHA-256("foundation_realm_trust_list" || key)."""
    return _sha256(b"foundation_realm_trust_list", _exact(key, KEY_SIZE, "key"))


def foundation_t3_attestation_key(station_id: bytes) -> bytes:
    """0x10 foundation_t3_attestation: SHA-256("foundation_t3_attestation" || station_id)."""
    return _sha256(b"foundation_t3_attestation", _exact(station_id, KEY_SIZE, "station_id"))


def content_announcement_key(mcid: bytes) -> bytes:
    """0x11 content_announcement: SHA-256(mcid), the 34-byte MCID."""
    return _sha256(_exact(mcid, MCID_SIZE, "mcid"))


def station_endpoint_key(station_key: bytes) -> bytes:
    """0x12 station_endpoint: SHA-256("station_endpoint" || station public key)."""
    return _sha256(b"station_endpoint", _exact(station_key, KEY_SIZE, "station_key"))


def org_directory_key(realm: bytes, org_name: str | bytes) -> bytes:
    """0x15 org_directory: SHA-256("org_directory" || realm id || org_name)."""
    return _sha256(
        b"org_directory", _exact(realm, KEY_SIZE, "realm"), _name_bytes(org_name, "org_name")
    )


def procedure_delegation_key(org_key: bytes, advertiser: bytes) -> bytes:
    """0x16 procedure_delegation: SHA-256("procedure_delegation" || org key || advertiser)."""
    return _sha256(
        b"procedure_delegation",
        _exact(org_key, KEY_SIZE, "org_key"),
        _exact(advertiser, KEY_SIZE, "advertiser"),
    )


def domain_record_key(record_type: int, key: bytes, subject_id: bytes | None = None) -> bytes:
    """0x20..0xFF: SHA-256(type byte || key || subject_id) with ``u``, else ``key`` itself."""
    if type(record_type) is not int or not is_domain_type(record_type):
        raise LocalProtocolError("bad_argument", "a domain record type is 0x20..0xFF")
    if subject_id is None:
        return signer_storage_key(key)
    if type(subject_id) is not bytes:
        raise LocalProtocolError("bad_argument", "subject_id must be bytes")
    return _sha256(bytes((record_type,)), _exact(key, KEY_SIZE, "key"), subject_id)
