"""Two threads of one process making the same key file at once (the daemon preflights two
attaching sessions of one agent in worker threads): both get the one identity that lands, and
neither sees "does not exist". The temporary file used to be named by pid alone, so the second
thread's exclusive open of it failed, was taken for "the key file exists", and it then read a
key file not yet linked into place."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from macula.keyfile import load_identity, load_or_create_identity, save_identity
from macula.private_file import write_private
from macula.wire.identity import Identity


def hold_both_writers_open(monkeypatch: pytest.MonkeyPatch, writers: int) -> None:
    """Each writer, when it fsyncs its temporary file, waits until every writer has one open:
    the overlap the daemon's threads hit by chance, made certain."""
    barrier = threading.Barrier(writers, timeout=5)
    real: Callable[[int], None] = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            barrier.wait()
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_two_threads_creating_one_key_file_agree_on_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    target = tmp_path / "agents" / "ada.key"
    hold_both_writers_open(monkeypatch, 2)
    with ThreadPoolExecutor(2) as pool:
        made = list(pool.map(lambda _: load_or_create_identity(target, difficulty=0), range(2)))
    assert made[0].node_id == made[1].node_id == load_identity(target).node_id
    assert [p.name for p in target.parent.iterdir()] == ["ada.key"]  # no temporary file left


def test_an_exclusive_save_beside_another_writer_of_the_same_file_still_refuses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    target = tmp_path / "ada.key"
    hold_both_writers_open(monkeypatch, 2)
    ours, theirs = (Identity.generate(os.urandom, difficulty=0) for _ in range(2))

    def save(identity: Identity) -> str:
        try:
            save_identity(target, identity, exclusive=True)
        except FileExistsError:
            return "refused"
        return "saved"

    with ThreadPoolExecutor(2) as pool:
        outcomes = sorted(pool.map(save, [ours, theirs]))
    assert outcomes == ["refused", "saved"]
    assert load_identity(target).node_id in {ours.node_id, theirs.node_id}
    assert [p.name for p in tmp_path.iterdir()] == ["ada.key"]


def test_a_named_file_in_a_missing_folder_is_an_error_not_a_new_folder(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    with pytest.raises(FileNotFoundError):
        write_private(missing / "endpoint", b"x\n", parents=False)
    assert not missing.exists()
    write_private(missing / "endpoint", b"x\n")
    assert stat.S_IMODE(missing.stat().st_mode) == 0o700
