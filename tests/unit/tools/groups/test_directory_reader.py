"""tools.groups.directory_reader: what mesh_remember_directory may read of a local tree (issue
26)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tools.groups import directory_reader
from tools.groups.directory_reader import DirectoryRead, ReadLimits, read_directory, resolve_root
from tools.server.results import InvalidArgument

TEXT = (".md", ".txt")
DEFAULT = ReadLimits()


def read(
    root: Path, limits: ReadLimits = DEFAULT, clock: Callable[[], float] = time.monotonic
) -> DirectoryRead:
    return read_directory(resolve_root(str(root)), TEXT, {"node_modules"}, limits, clock)


def texts(found: DirectoryRead) -> dict[str, str]:
    return {file.relative: file.text for file in found.files}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text("# hello\n")
    (root / "docs" / "guide.txt").write_text("a guide\n")
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "canary.md").write_text("CANARY outside the tree\n")
    return secret


def test_plain_text_files_are_read_by_relative_path(tree: Path) -> None:
    got = read(tree)
    assert texts(got) == {"README.md": "# hello\n", "docs/guide.txt": "a guide\n"}
    assert got.stopped is None


def test_a_symbolic_link_out_of_the_tree_is_never_followed(tree: Path, outside: Path) -> None:
    (tree / "leak.md").symlink_to(outside / "canary.md")
    (tree / "docs" / "elsewhere").symlink_to(outside)
    (tree / "passwd.txt").symlink_to("/etc/passwd")
    (tree / "zero.md").symlink_to("/dev/zero")
    (tree / "inside.md").symlink_to(tree / "README.md")  # even a link inside: not followed
    got = read(tree)
    assert set(texts(got)) == {"README.md", "docs/guide.txt"}
    assert got.skipped["symbolic_link"] == 5
    assert "leak.md" in got.samples["symbolic_link"]
    assert all("CANARY" not in text for text in texts(got).values())


def test_fifos_and_sockets_are_refused_without_blocking(tree: Path) -> None:
    os.mkfifo(tree / "pipe.md")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tree / "sock.txt"))
    done = threading.Event()
    results: list[DirectoryRead] = []

    def run() -> None:
        results.append(read(tree))
        done.set()

    threading.Thread(target=run, daemon=True).start()
    try:
        assert done.wait(10), "the read blocked on the FIFO"
    finally:
        if not done.is_set():  # unblock the reader so the thread can end
            os.close(os.open(tree / "pipe.md", os.O_WRONLY | os.O_NONBLOCK))
        listener.close()
    result = results[0]
    assert result.skipped["not_a_regular_file"] == 2
    assert set(texts(result)) == {"README.md", "docs/guide.txt"}


def test_secret_looking_names_folders_and_contents_are_skipped_and_reported(tree: Path) -> None:
    for name in (".env", ".env.local.md", "id_rsa.txt", "server.pem.md", "credentials.md"):
        (tree / name).write_text("password=hunter2\n")
    for folder in (".ssh", ".git", ".aws", ".gnupg"):
        (tree / folder).mkdir()
        (tree / folder / "notes.md").write_text("secret\n")
    (tree / "key.md").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n")
    got = read(tree)
    assert set(texts(got)) == {"README.md", "docs/guide.txt"}
    skipped = got.skipped
    assert skipped["secret_looking_name"] == 4  # .env: not .md anyway
    assert skipped["secret_looking_folder"] == 4
    assert skipped["secret_looking_content"] == 1
    assert ".ssh/" in got.samples["secret_looking_folder"]


def test_every_cap_stops_or_skips_and_says_so(tree: Path) -> None:
    (tree / "big.md").write_text("x" * 2000)
    (tree / "bin.md").write_bytes(b"\x00\x01binary")
    got = read(tree, ReadLimits(max_file_bytes=1000))
    assert got.skipped["larger_than_max_file_bytes"] == 1
    assert got.skipped["binary_or_empty"] == 1
    for i in range(10):
        (tree / f"n{i}.md").write_text(f"note {i}\n")
    assert read(tree, ReadLimits(max_files=3)).stopped == "max_files"
    assert len(read(tree, ReadLimits(max_files=3)).files) == 3
    assert read(tree, ReadLimits(max_total_bytes=20)).stopped == "max_total_bytes"
    assert read(tree, ReadLimits(max_entries=4)).stopped == "max_entries"


def test_the_walk_stops_at_its_deadline(tree: Path) -> None:
    for i in range(20):
        (tree / f"n{i}.md").write_text(f"note {i}\n")

    def ticking() -> Iterator[float]:
        now = 0.0
        while True:
            yield now
            now += 1.0

    clock = ticking()
    got = read(tree, ReadLimits(deadline_s=5.0), lambda: next(clock))
    assert got.stopped == "deadline"
    assert 0 < len(texts(got)) < 20


@pytest.mark.parametrize(
    ("directory", "says"),
    [
        ("~", "'~' is not expanded"),
        ("~root", "'~' is not expanded"),
        ("{tree}/../outside", "'..' is refused"),
        ("{tree}/docs/..", "'..' is refused"),
        ("/proc/self", "pseudo-filesystem"),
        ("/dev", "pseudo-filesystem"),
        ("/dev/zero", "not a directory"),
        ("{tree}/README.md", "not a directory"),
        ("{tree}/nope", "No such file"),
        ("/" + "x" * 5000, "name too long"),
        ("{tree}/" + "y" * 300, "name too long"),
        ("", "non-empty"),
        ("a\x00b", "NUL"),
    ],
)
def test_a_root_that_is_not_a_plain_directory_is_refused_saying_why(
    tree: Path, outside: Path, directory: str, says: str
) -> None:
    with pytest.raises(InvalidArgument, match="directory: ") as refused:
        resolve_root(directory.format(tree=tree))
    assert says in str(refused.value)


def test_pseudo_filesystems_inside_the_tree_are_not_walked(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As /proc, /sys and /dev are skipped when the tree is /, without walking / here."""
    monkeypatch.setattr(directory_reader, "PSEUDO_ROOTS", (tree / "docs",))
    got = read(tree)
    assert texts(got) == {"README.md": "# hello\n"}
    assert got.samples["pseudo_filesystem"] == ["docs/"]
