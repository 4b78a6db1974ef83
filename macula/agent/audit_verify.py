"""Checking an audit trail (``macula.agent.audit``): the first entry edited, removed or
reordered, a cut end, a checkpoint or anchor that does not verify.

``verify_trail(directory)`` reads the files only (no lock, no key) and stops at the first
problem, naming the segment, the line and the seq. It needs no secret: hashes are plain
SHA-256 and the checkpoints verify against the node id (the trail's folder name).

What each problem means:
- ``edited``: a line is not an entry, an entry's hash is not its content's, an entry's ``prev``
  is not the previous entry's hash (the previous one was rewritten and rehashed), or a signed
  checkpoint or the anchor does not verify (entries before it were rewritten);
- ``removed``: seq jumps over entries that appear nowhere later (including a whole segment, or
  the oldest ones without an anchor);
- ``reordered``: an entry comes before one with a lower seq;
- ``truncated``: the last line is cut, or the trail ends before the head says it does;
- ``head_missing``: the head file is gone, so a cut end cannot be ruled out;
- ``checkpoint_missing``: no checkpoint where the writer always signs (right after every entry
  whose seq is a multiple of ``CHECKPOINT_EVERY``, and as a segment's last entry): checkpoints
  were removed and the chain rehashed. Only the newest entries (at most ``CHECKPOINT_EVERY - 1``
  after the last due checkpoint) may be unsigned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from macula.agent.audit import CHECKPOINT_EVERY, anchor_message, checkpoint_message
from macula.store.audit_log import (
    CHECKPOINT_KIND,
    GENESIS,
    Entry,
    canonical,
    entry_hash,
    parse_entry,
    read_anchor,
    read_head,
    read_lines,
    segments,
)
from macula.wire.identity import verify

CHECKPOINT_MISSING = "checkpoint_missing"
Message = Callable[[bytes, int, str], bytes]


@dataclass(frozen=True, slots=True)
class Problem:
    kind: str  # edited / removed / reordered / truncated / head_missing / checkpoint_missing
    detail: str
    seq: int | None = None
    segment: str = ""
    line: int = 0


@dataclass(slots=True)
class TrailReport:
    """What ``verify_trail`` found: the span checked and the first problem, if any."""

    node_id: str
    first_seq: int = 0
    last_seq: int = 0
    entries: int = 0
    checkpoints: int = 0
    last_checkpoint: int = 0
    anchored_at: int = 0  # the seq of the anchor (entries up to it were dropped by rotation)
    problem: Problem | None = None
    notes: list[str] = field(default_factory=list)


class _Broken(Exception):
    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.detail)
        self.problem = problem


@dataclass(frozen=True, slots=True)
class _Line:
    segment: str
    number: int
    data: bytes
    whole: bool
    first: int = 0  # the seq the segment's name says it starts at


def _node_of(directory: Path) -> str:
    name = directory.name
    try:
        return name if len(bytes.fromhex(name)) == 32 else ""
    except ValueError:
        return ""


def _lines(directory: Path, anchor: tuple[int, str]) -> Iterator[_Line]:
    """The lines of the segments after ``anchor`` (seq, hash); a segment at or below it must
    be the one a rotation dropped but did not unlink yet: ending at the anchor's entry."""
    held = segments(directory)
    for index, (first, path) in enumerate(held):
        following = held[index + 1][0] if index + 1 < len(held) else None
        if following is not None and following - 1 <= anchor[0]:
            _leftover(path, following, anchor)
            continue
        for number, data, whole in read_lines(path):
            yield _Line(path.name, number, data, whole, first)


def _leftover(path: Path, following: int, anchor: tuple[int, str]) -> None:
    last = None
    for _, data, _ in read_lines(path):
        last = data
    entry = parse_entry(last) if last is not None else None
    ends_at_anchor = entry is not None and (entry["seq"], entry.get("hash")) == anchor
    if following != anchor[0] + 1 or not ends_at_anchor:
        raise _Broken(Problem("edited", f"{path.name} lies below the anchor (seq {anchor[0]}) "
                              "but is not the segment a rotation dropped: it was put there",
                              anchor[0], path.name))  # fmt: skip


def _signed(
    node_id: str,
    seq: int,
    head_hash: str,
    signature: object,
    message_of: Message = checkpoint_message,
) -> bool:
    try:
        message = message_of(bytes.fromhex(node_id), seq, head_hash)
        return verify(bytes.fromhex(node_id), message, bytes.fromhex(str(signature)))
    except (ValueError, TypeError):
        return False


def verify_trail(directory: Path, checkpoint_every: int = CHECKPOINT_EVERY) -> TrailReport:
    """Check the trail in ``directory`` (see the module docstring); ``checkpoint_every``: the
    writer's cadence (``macula.agent.audit.CHECKPOINT_EVERY``; another only in tests)."""
    report = TrailReport(node_id=_node_of(directory))
    try:
        _walk(directory, report, checkpoint_every)
    except _Broken as broken:
        report.problem = broken.problem
    return report


def _walk(directory: Path, report: TrailReport, every: int) -> None:
    expected, prev = _start(directory, report)
    lines = list(_lines(directory, (expected - 1, prev)))
    signed, segment = 1, ""  # the previous entry is a checkpoint (or there is none); its segment
    for index, line in enumerate(lines):
        entry = _entry(line, index == len(lines) - 1, expected)
        seq = entry["seq"]
        if entry_hash(entry) != entry.get("hash"):
            raise _Broken(_at(line, "edited", f"seq {seq} was edited (its hash does not match)",
                              seq))  # fmt: skip
        if seq != expected:
            raise _Broken(_misplaced(seq, expected, lines[index + 1 :], line))
        if entry.get("prev") != prev:
            raise _Broken(_at(line, "edited", f"seq {seq - 1} was edited and rehashed (seq {seq} "
                              "links to another hash)", seq - 1))  # fmt: skip
        if line.segment != segment and seq != line.first:
            raise _Broken(_at(line, "edited", f"{line.segment} starts at seq {seq}, not at the "
                              "seq its name says: segments were renamed", seq))  # fmt: skip
        is_checkpoint = entry.get("kind") == CHECKPOINT_KIND
        if not signed and not is_checkpoint and ((seq - 1) % every == 0 or line.segment != segment):
            raise _Broken(_unsigned(seq - 1, line))
        if is_checkpoint:
            _checkpoint(entry, prev, report, line)
        report.first_seq = report.first_seq or seq
        report.last_seq, report.entries = seq, report.entries + 1
        prev, expected, signed, segment = entry["hash"], seq + 1, int(is_checkpoint), line.segment
    held = segments(directory)
    if not signed and held and segment and held[-1][1].name != segment:  # an empty newest one
        raise _Broken(_unsigned(report.last_seq, _Line(segment, 0, b"", True)))
    _end(directory, report, prev)


def _unsigned(seq: int, line: _Line) -> Problem:
    """A checkpoint missing after ``seq`` where the writer always signs (every ``every`` seq,
    at a segment's end): checkpoints were removed and the chain rehashed."""
    return _at(line, CHECKPOINT_MISSING, f"no checkpoint after seq {seq}, where the writer "
               "always signs: checkpoints were removed and the entries rehashed", seq)  # fmt: skip


def _start(directory: Path, report: TrailReport) -> tuple[int, str]:
    """Where the chain must start: after the anchor (a rotation dropped what came before),
    else at seq 1."""
    anchor = read_anchor(directory)
    if anchor is None:
        return 1, GENESIS
    seq, head_hash = anchor.get("seq"), anchor.get("hash")
    node = str(anchor.get("node_id", ""))
    valid = isinstance(seq, int) and isinstance(head_hash, str) and len(head_hash) == 64
    if not valid or (report.node_id and node != report.node_id):
        raise _Broken(Problem("edited", "anchor.json is not this trail's anchor", None))
    assert isinstance(seq, int) and isinstance(head_hash, str)
    if not _signed(node, seq, head_hash, anchor.get("signature"), anchor_message):
        raise _Broken(Problem("edited", "anchor.json does not verify against the node id", seq))
    report.node_id = report.node_id or node
    report.anchored_at = seq
    return seq + 1, head_hash


def _at(line: _Line, kind: str, detail: str, seq: int | None) -> Problem:
    return Problem(kind, detail, seq, line.segment, line.number)


def _entry(line: _Line, last: bool, expected: int) -> Entry:
    """The entry on ``line``, or the problem: a cut line (truncated at the end, else edited),
    or a line that is not an entry (``expected``: the seq that should be there)."""
    if not line.whole:
        kind = "truncated" if last else "edited"
        raise _Broken(_at(line, kind, f"the line of seq {expected} is cut", expected))
    entry = parse_entry(line.data)
    if entry is None:
        raise _Broken(_at(line, "edited", f"the line of seq {expected} is not an entry", expected))
    if canonical(entry) != line.data:  # a key twice, spaces: what a reader sees may differ
        seq = entry["seq"]
        raise _Broken(_at(line, "edited", f"the line of seq {seq} is not as the writer writes "
                          "it (one canonical JSON: a key twice, spaces)", seq))  # fmt: skip
    return entry


def _misplaced(seq: int, expected: int, rest: list[_Line], line: _Line) -> Problem:
    if seq < expected:
        return _at(line, "reordered", f"seq {seq} comes after seq {expected - 1}", seq)
    ahead = {e["seq"] for e in (parse_entry(later.data) for later in rest) if e is not None}
    if expected in ahead:
        return _at(line, "reordered", f"seq {seq} comes before seq {expected}", expected)
    missing = f"seq {expected}" if seq == expected + 1 else f"seq {expected}..{seq - 1}"
    return _at(line, "removed", f"{missing} removed (the next entry is seq {seq})", expected)


def _checkpoint(entry: Entry, prev: str, report: TrailReport, line: _Line) -> None:
    facts = entry.get("facts") or {}
    seq = entry["seq"]
    node = str(facts.get("node_id", ""))
    sound = (
        facts.get("signed_seq") == seq - 1
        and facts.get("signed_hash") == prev
        and (not report.node_id or node == report.node_id)
        and _signed(node, seq - 1, prev, facts.get("signature"))
    )
    if not sound:
        after = report.last_checkpoint or report.anchored_at
        raise _Broken(_at(line, "edited", f"the checkpoint at seq {seq} does not verify: "
                          f"entries after seq {after} were rewritten", after + 1))  # fmt: skip
    report.node_id = report.node_id or node
    report.checkpoints += 1
    report.last_checkpoint = seq


def _end(directory: Path, report: TrailReport, last_hash: str) -> None:
    head = read_head(directory)
    if head is None:  # even with no entry: every segment and the head deleted is a wiped trail
        raise _Broken(Problem("head_missing", "the head file is missing or unreadable: a "
                              "cut end cannot be ruled out", report.last_seq))  # fmt: skip
    if head.seq > report.last_seq:
        raise _Broken(Problem("truncated", f"the trail ends at seq {report.last_seq} but its "
                              f"head says seq {head.seq}", report.last_seq + 1,
                              segment=head.segment))  # fmt: skip
    if head.seq == report.last_seq and head.seq and head.hash != last_hash:
        raise _Broken(Problem("edited", f"seq {head.seq} is not the entry the head recorded",
                              head.seq))  # fmt: skip
    if report.last_seq > report.last_checkpoint:
        report.notes.append(
            f"{report.last_seq - report.last_checkpoint} entries after the last checkpoint "
            "are chained but not signed yet"
        )
