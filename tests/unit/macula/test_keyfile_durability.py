"""A key file's rename is made durable: after the temporary file is fsynced and renamed (or
linked) into place, its directory is fsynced too. The real fsync runs; the test only watches
which descriptors it is given."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from macula.keyfile import load_identity, save_identity
from macula.wire.identity import Identity


@dataclass(frozen=True)
class Synced:
    is_dir: bool
    inode: tuple[int, int]
    target_in_place: bool


def watch_fsync(monkeypatch: pytest.MonkeyPatch, target: Path) -> list[Synced]:
    seen: list[Synced] = []
    real: Callable[[int], None] = os.fsync

    def fsync(fd: int) -> None:
        info = os.fstat(fd)
        seen.append(Synced(stat.S_ISDIR(info.st_mode), (info.st_dev, info.st_ino), target.exists()))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def inode(path: Path) -> tuple[int, int]:
    info = path.stat()
    return (info.st_dev, info.st_ino)


@pytest.mark.parametrize("exclusive", [False, True])
def test_the_directory_is_fsynced_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exclusive: bool
) -> None:
    path = tmp_path / "home" / "agent.key"
    seen = watch_fsync(monkeypatch, path)
    identity = Identity(b"\5" * 32)
    save_identity(path, identity, exclusive=exclusive)
    assert [s.is_dir for s in seen] == [False, True]  # the file's data, then the directory
    assert seen[1].inode == inode(path.parent) and seen[1].target_in_place
    assert not seen[0].target_in_place  # the data was synced before the rename
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_identity(path).node_id == identity.node_id


def test_replacing_an_existing_key_file_syncs_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "agent.key"
    save_identity(path, Identity(b"\5" * 32))
    seen = watch_fsync(monkeypatch, path)
    save_identity(path, Identity(b"\6" * 32))
    assert seen[-1].is_dir and seen[-1].inode == inode(tmp_path)
    assert load_identity(path).node_id == Identity(b"\6" * 32).node_id
