"""Content addressing of Macula wire v2 (PROTOCOL.md §11): MCIDs, chunking, Merkle root, manifests.

Invariants:
- An MCID is exactly 34 bytes: version 0x01, codec 0x55 (raw block) or 0x56 (manifest), 32-byte
  digest. ``Mcid`` refuses anything else on construction (``LocalProtocolError``) and on parsing
  (``ProtocolError``).
- Digests are 32 bytes, BLAKE3 by default or SHA-256; a raw block's digest does not say which.
- Chunks are consecutive ``chunk_size`` slices of the data, only the last one short, none empty;
  leaves are the chunk digests in index order; the Merkle fold pairs an odd last node with itself;
  one leaf is its own root and no leaf gives ``H(b"")`` (§11.2).
- A ``Manifest`` is structurally consistent whenever it exists (count, indices, offsets, sizes,
  codec); whether its MCID and root match its content is checked only by ``verify_mcid`` /
  ``verify``, because that costs hashing and a peer's claim is what is being judged.
- Anything read from a peer raises ``ProtocolError`` (``ContentInvalid`` when bytes do not match
  their id or a manifest contradicts itself), never ``KeyError``/``TypeError``/``UnicodeError``.
No I/O, no clock (``created`` is an argument), no randomness.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from blake3 import blake3

from macula.wire import cbor
from macula.wire.errors import ContentInvalid, LocalProtocolError, ProtocolError

__all__ = [
    "CHUNK_SIZE",
    "CODEC_MANIFEST",
    "CODEC_RAW",
    "DIGEST_SIZE",
    "MANIFEST_VERSION",
    "MCID_SIZE",
    "MCID_VERSION",
    "ChunkInfo",
    "HashAlgorithm",
    "Manifest",
    "Mcid",
    "PutPlan",
    "assemble",
    "chunk",
    "chunk_mcid",
    "digest",
    "merkle_levels",
    "merkle_root",
    "plan_put",
    "raw_mcid",
    "verify_block",
]

MCID_VERSION: Final = 0x01
CODEC_RAW: Final = 0x55
CODEC_MANIFEST: Final = 0x56
CHUNK_SIZE: Final = 262_144
DIGEST_SIZE: Final = 32
MCID_SIZE: Final = 2 + DIGEST_SIZE
MANIFEST_VERSION: Final = 1

HashAlgorithm = Literal["blake3", "sha256"]
Buffer = bytes | bytearray | memoryview
_CODECS: Final = (CODEC_RAW, CODEC_MANIFEST)


def digest(data: Buffer, algorithm: HashAlgorithm = "blake3") -> bytes:
    """The 32-byte digest of ``data`` (BLAKE3 by default, or SHA-256)."""
    if algorithm == "blake3":
        return blake3(data).digest()
    if algorithm == "sha256":
        return hashlib.sha256(data).digest()
    raise LocalProtocolError("unknown_hash_algorithm", f"{algorithm!r} is not blake3 or sha256")


@dataclass(frozen=True, slots=True)
class Mcid:
    """A Macula content id (§11.1): ``version || codec || digest``."""

    version: int
    codec: int
    digest: bytes

    def __post_init__(self) -> None:
        if self.version != MCID_VERSION or self.codec not in _CODECS:
            raise LocalProtocolError(
                "bad_mcid", f"version {self.version!r} / codec {self.codec!r} is not an MCID"
            )
        if type(self.digest) is not bytes or len(self.digest) != DIGEST_SIZE:
            raise LocalProtocolError("bad_mcid", "an MCID digest is exactly 32 bytes")

    @classmethod
    def from_bytes(cls, data: object) -> Mcid:
        """Parse 34 bytes received from a peer; ``ProtocolError`` names what is wrong."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ProtocolError("bad_mcid_type", f"an MCID is bytes, not {type(data).__name__}")
        raw = bytes(data)
        if len(raw) != MCID_SIZE:
            raise ProtocolError("bad_mcid_length", f"an MCID is 34 bytes, got {len(raw)}")
        if raw[0] != MCID_VERSION:
            raise ProtocolError("bad_mcid_version", f"MCID version {raw[0]:#04x}, expected 0x01")
        if raw[1] not in _CODECS:
            raise ProtocolError("bad_mcid_codec", f"MCID codec {raw[1]:#04x} is not 0x55 or 0x56")
        return cls(raw[0], raw[1], raw[2:])

    def to_bytes(self) -> bytes:
        return bytes((self.version, self.codec)) + self.digest

    def hex(self) -> str:
        return self.to_bytes().hex()

    @property
    def is_manifest(self) -> bool:
        return self.codec == CODEC_MANIFEST


def raw_mcid(data: Buffer, algorithm: HashAlgorithm = "blake3") -> Mcid:
    """MCID of a raw block: ``0x01 0x55 || H(data)``."""
    return Mcid(MCID_VERSION, CODEC_RAW, digest(data, algorithm))


def chunk_mcid(chunk_hash: bytes) -> Mcid:
    """MCID under which a chunk is stored: ``0x01 0x55 || chunk hash`` (§11.2)."""
    return Mcid(MCID_VERSION, CODEC_RAW, chunk_hash)


def verify_block(mcid: Mcid, data: Buffer, algorithm: HashAlgorithm = "blake3") -> None:
    """Raise ``ContentInvalid`` unless ``data`` is the raw block named by ``mcid``."""
    if mcid.codec != CODEC_RAW:
        raise ContentInvalid("not_a_block_mcid", f"MCID {mcid.hex()} names a manifest, not a block")
    if digest(data, algorithm) != mcid.digest:
        raise ContentInvalid(
            "block_hash_mismatch", f"block does not hash ({algorithm}) to {mcid.hex()}"
        )


# --- chunking and Merkle root (§11.2) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """One entry of a manifest's ``chunks``: ``{"index", "offset", "size", "hash"}``."""

    index: int
    offset: int
    size: int
    hash: bytes

    def __post_init__(self) -> None:
        for name in ("index", "offset", "size"):
            if not _is_uint(getattr(self, name)):
                raise LocalProtocolError("bad_chunk_info", f"chunk {name} must be a uint")
        if type(self.hash) is not bytes or len(self.hash) != DIGEST_SIZE:
            raise LocalProtocolError("bad_chunk_info", "a chunk hash is exactly 32 bytes")

    @property
    def mcid(self) -> Mcid:
        return chunk_mcid(self.hash)

    def to_wire(self) -> dict[str, object]:
        return {"index": self.index, "offset": self.offset, "size": self.size, "hash": self.hash}

    @classmethod
    def from_wire(cls, value: object, position: int) -> ChunkInfo:
        where = f"chunks[{position}]"
        if not isinstance(value, Mapping):
            raise ProtocolError("manifest_field_type", f"{where} must be a map")
        index, offset, size = (
            _uint_field(value, key, where) for key in ("index", "offset", "size")
        )
        chunk_hash = _field(value, "hash", where)
        if type(chunk_hash) is not bytes or len(chunk_hash) != DIGEST_SIZE:
            raise ProtocolError("bad_chunk_hash", f"{where}.hash must be bytes(32)")
        return cls(index, offset, size, chunk_hash)


def chunk(
    data: Buffer, chunk_size: int = CHUNK_SIZE, algorithm: HashAlgorithm = "blake3"
) -> list[ChunkInfo]:
    """Split ``data`` into consecutive ``chunk_size`` slices and hash each (no copies)."""
    _check_chunk_size(chunk_size)
    view = memoryview(data).cast("B")
    chunks = []
    for index, offset in enumerate(range(0, len(view), chunk_size)):
        part = view[offset : offset + chunk_size]
        chunks.append(ChunkInfo(index, offset, len(part), digest(part, algorithm)))
    return chunks


def merkle_levels(
    leaves: Sequence[bytes], algorithm: HashAlgorithm = "blake3"
) -> list[list[bytes]]:
    """Every level of the fold, leaves first, root last; no leaves gives ``[[]]``."""
    levels = [list(leaves)]
    while len(levels[-1]) > 1:
        level = levels[-1]
        if len(level) % 2:
            level = [*level, level[-1]]
        levels.append([digest(level[i] + level[i + 1], algorithm) for i in range(0, len(level), 2)])
    return levels


def merkle_root(leaves: Sequence[bytes], algorithm: HashAlgorithm = "blake3") -> bytes:
    """Merkle root of §11.2: one leaf is its own root, no leaf gives ``H(b"")``."""
    if not leaves:
        return digest(b"", algorithm)
    return merkle_levels(leaves, algorithm)[-1][0]


# --- manifests (§11.3, §11.4) -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Manifest:
    """A manifest as carried by ``_content.put_manifest`` / ``get_manifest``."""

    mcid: Mcid
    version: int
    name: str
    size: int
    created: int
    chunk_size: int
    chunk_count: int
    hash_algorithm: HashAlgorithm
    root_hash: bytes
    chunks: tuple[ChunkInfo, ...]

    def __post_init__(self) -> None:
        problem = _structure_problem(self)
        if problem is not None:
            raise LocalProtocolError(*problem)

    @classmethod
    def create(
        cls,
        data: Buffer,
        name: str = "unnamed",
        *,
        created: int,
        chunk_size: int = CHUNK_SIZE,
        algorithm: HashAlgorithm = "blake3",
    ) -> Manifest:
        """Chunk and hash ``data``; ``created`` is Unix seconds, given by the caller."""
        chunks = tuple(chunk(data, chunk_size, algorithm))
        size = sum(c.size for c in chunks)
        root = merkle_root([c.hash for c in chunks], algorithm)
        canonical = _canonical(name, size, chunk_size, len(chunks), algorithm, root)
        mcid = Mcid(MCID_VERSION, CODEC_MANIFEST, digest(cbor.encode(canonical), algorithm))
        return cls(
            mcid,
            MANIFEST_VERSION,
            name,
            size,
            created,
            chunk_size,
            len(chunks),
            algorithm,
            root,
            chunks,
        )

    def canonical_map(self) -> dict[str, object]:
        """The six fields covered by the manifest MCID (§11.3)."""
        return _canonical(
            self.name,
            self.size,
            self.chunk_size,
            self.chunk_count,
            self.hash_algorithm,
            self.root_hash,
        )

    def compute_mcid(self) -> Mcid:
        canonical = cbor.encode(self.canonical_map())
        return Mcid(MCID_VERSION, CODEC_MANIFEST, digest(canonical, self.hash_algorithm))

    def verify_mcid(self, expected: Mcid | None = None) -> None:
        """Raise ``ContentInvalid`` unless the MCID recomputed from the fields equals ``mcid``
        (and ``expected``, the MCID that was asked for, when given)."""
        computed = self.compute_mcid()
        if computed != self.mcid:
            raise ContentInvalid(
                "manifest_mcid_mismatch",
                f"fields hash to {computed.hex()}, manifest says {self.mcid.hex()}",
            )
        if expected is not None and expected != computed:
            raise ContentInvalid(
                "manifest_mcid_mismatch", f"asked for {expected.hex()}, got {computed.hex()}"
            )

    def verify(self, expected: Mcid | None = None) -> None:
        """``verify_mcid`` plus: the chunk hashes fold to ``root_hash`` (what a station checks)."""
        self.verify_mcid(expected)
        root = merkle_root([c.hash for c in self.chunks], self.hash_algorithm)
        if root != self.root_hash:
            raise ContentInvalid("merkle_root_mismatch", "chunk hashes do not fold to root_hash")

    def to_wire(self) -> dict[str, object]:
        """The §11.4 map (``name`` as text)."""
        return {
            "mcid": self.mcid.to_bytes(),
            "version": self.version,
            "name": self.name,
            "size": self.size,
            "created": self.created,
            "chunk_size": self.chunk_size,
            "chunk_count": self.chunk_count,
            "hash_algorithm": self.hash_algorithm,
            "root_hash": self.root_hash,
            "chunks": [c.to_wire() for c in self.chunks],
        }

    @classmethod
    def from_wire(cls, value: object) -> Manifest:
        """Strictly parse a §11.4 map from a peer. Unknown keys are ignored; ``name`` may be
        text or UTF-8 bytes; an unknown ``hash_algorithm`` text is read as ``blake3``."""
        if not isinstance(value, Mapping):
            raise ProtocolError(
                "manifest_not_map", f"a manifest is a map, not {type(value).__name__}"
            )
        mcid = Mcid.from_bytes(_field(value, "mcid"))
        uints = {key: _uint_field(value, key) for key in _UINT_FIELDS}
        root_hash = _field(value, "root_hash")
        if type(root_hash) is not bytes or len(root_hash) != DIGEST_SIZE:
            raise ProtocolError("manifest_field_type", "root_hash must be bytes(32)")
        raw_chunks = _field(value, "chunks")
        if type(raw_chunks) is not list:
            raise ProtocolError("manifest_field_type", "chunks must be an array")
        chunks = tuple(ChunkInfo.from_wire(item, i) for i, item in enumerate(raw_chunks))
        try:
            return cls(
                mcid,
                uints["version"],
                _name_from_wire(_field(value, "name")),
                uints["size"],
                uints["created"],
                uints["chunk_size"],
                uints["chunk_count"],
                _algorithm_from_wire(_field(value, "hash_algorithm")),
                root_hash,
                chunks,
            )
        except LocalProtocolError as exc:  # a structural contradiction inside the peer's map
            raise ContentInvalid(exc.reason, exc.detail) from None


_UINT_FIELDS: Final = ("version", "size", "created", "chunk_size", "chunk_count")


def _canonical(
    name: str, size: int, chunk_size: int, chunk_count: int, algorithm: str, root: bytes
) -> dict[str, object]:
    return {
        "name": name,
        "size": size,
        "chunk_size": chunk_size,
        "chunk_count": chunk_count,
        "hash_algorithm": algorithm,
        "root_hash": root,
    }


def _structure_problem(m: Manifest) -> tuple[str, str] | None:
    """The first way ``m`` contradicts itself, as ``(reason, detail)``, or ``None``."""
    if not isinstance(m.mcid, Mcid) or m.mcid.codec != CODEC_MANIFEST:
        return "mcid_not_manifest", "a manifest's mcid has codec 0x56"
    if m.version != MANIFEST_VERSION:
        return "unsupported_manifest_version", f"manifest version {m.version}, expected 1"
    if type(m.name) is not str:
        return "bad_manifest_name", "name must be text"
    if m.hash_algorithm not in ("blake3", "sha256"):
        return "unknown_hash_algorithm", f"{m.hash_algorithm!r} is not blake3 or sha256"
    for key in _UINT_FIELDS:
        if not _is_uint(getattr(m, key)):
            return "manifest_field_type", f"{key} must be a uint"
    if m.chunk_size < 1:
        return "bad_chunk_size", "chunk_size must be at least 1"
    if type(m.root_hash) is not bytes or len(m.root_hash) != DIGEST_SIZE:
        return "manifest_field_type", "root_hash must be bytes(32)"
    if m.chunk_count != len(m.chunks):
        return "chunk_count_mismatch", f"chunk_count {m.chunk_count}, {len(m.chunks)} chunks listed"
    offset = 0
    for i, c in enumerate(m.chunks):
        last = i == len(m.chunks) - 1
        if c.index != i:
            return "chunk_index_out_of_order", f"chunks[{i}] has index {c.index}"
        if c.offset != offset:
            return "chunk_offsets_not_contiguous", f"chunks[{i}] at {c.offset}, expected {offset}"
        if c.size > m.chunk_size or c.size == 0 or (not last and c.size != m.chunk_size):
            return "bad_chunk_length", f"chunks[{i}] is {c.size} bytes (chunk_size {m.chunk_size})"
        offset += c.size
    if offset != m.size:
        return "chunk_sizes_mismatch", f"chunks cover {offset} bytes, size is {m.size}"
    return None


def _is_uint(value: object) -> bool:
    return type(value) is int and value >= 0


def _field(value: Mapping[object, object], key: str, where: str = "manifest") -> object:
    if key not in value:
        raise ProtocolError("manifest_field_missing", f"{where} has no {key!r}")
    return value[key]


def _uint_field(value: Mapping[object, object], key: str, where: str = "manifest") -> int:
    item = _field(value, key, where)
    if type(item) is not int or item < 0:
        raise ProtocolError("manifest_field_type", f"{where}.{key} must be a uint")
    return item


def _name_from_wire(value: object) -> str:
    if type(value) is str:
        return value
    if type(value) is bytes:  # Erlang SDK / reference station send the name as bytes (§11.5)
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("manifest_name_not_utf8", "bytes name is not UTF-8") from None
    raise ProtocolError("manifest_field_type", "name must be text or bytes")


def _algorithm_from_wire(value: object) -> HashAlgorithm:
    if type(value) is not str:
        raise ProtocolError("manifest_field_type", "hash_algorithm must be text")
    return "sha256" if value == "sha256" else "blake3"  # §11.4: unknown values read as blake3


def _check_chunk_size(chunk_size: int) -> None:
    if not _is_uint(chunk_size) or chunk_size < 1:
        raise LocalProtocolError("bad_chunk_size", f"chunk_size must be >= 1, got {chunk_size!r}")


# --- whole transfers (§11.5) ------------------------------------------------------------------


def assemble(manifest: Manifest, blocks: Sequence[Buffer]) -> bytes:
    """Check fetched chunks against ``manifest`` (hash, size, count, Merkle root) and join them.

    The caller checks the manifest itself first (``manifest.verify_mcid(asked_for)``).
    """
    algorithm = manifest.hash_algorithm
    if len(blocks) != manifest.chunk_count:
        raise ContentInvalid(
            "chunk_count_mismatch", f"{len(blocks)} blocks for {manifest.chunk_count} chunks"
        )
    for info, block in zip(manifest.chunks, blocks, strict=True):
        if len(block) != info.size:
            raise ContentInvalid(
                "chunk_size_mismatch",
                f"chunk {info.index}: {len(block)} bytes, expected {info.size}",
            )
        if digest(block, algorithm) != info.hash:
            raise ContentInvalid(
                "chunk_hash_mismatch", f"chunk {info.index} does not match its hash"
            )
    data = b"".join(blocks)
    if len(data) != manifest.size:
        raise ContentInvalid(
            "size_mismatch", f"assembled {len(data)} bytes, manifest says {manifest.size}"
        )
    if merkle_root([c.hash for c in manifest.chunks], algorithm) != manifest.root_hash:
        raise ContentInvalid("merkle_root_mismatch", "chunk hashes do not fold to root_hash")
    return data


@dataclass(frozen=True, slots=True)
class PutPlan:
    """What a client stores for one put: ``blocks`` in order, then ``manifest`` if any.

    ``mcid`` is what the put returns (the raw MCID, or the manifest MCID). Block payloads are
    read-only views into the data (no copies); ``cbor.encode`` accepts them as byte strings.
    """

    mcid: Mcid
    blocks: tuple[tuple[Mcid, memoryview], ...]
    manifest: Manifest | None


def plan_put(
    data: Buffer,
    name: str = "unnamed",
    *,
    created: int,
    chunk_size: int = CHUNK_SIZE,
    algorithm: HashAlgorithm = "blake3",
) -> PutPlan:
    """Plan a put (§11.5): data that fits one chunk (≤ 262 144 bytes by default, empty included)
    is one raw block; larger data is its chunks followed by a manifest."""
    _check_chunk_size(chunk_size)
    frozen = data if isinstance(data, bytes) else bytes(data)  # later caller edits cannot leak in
    view = memoryview(frozen)
    if len(view) <= chunk_size:
        mcid = raw_mcid(view, algorithm)
        return PutPlan(mcid, ((mcid, view),), None)
    manifest = Manifest.create(
        view, name, created=created, chunk_size=chunk_size, algorithm=algorithm
    )
    blocks = tuple((c.mcid, view[c.offset : c.offset + c.size]) for c in manifest.chunks)
    return PutPlan(manifest.mcid, blocks, manifest)
