"""The commit guard's hook (tools.guard.hook) in real git repositories: installed beside an
existing hook and never over it, uninstalled byte for byte; and its verdict (tools.guard.check):
own, shared and expired reservations pass, another's exclusive one refuses (issue 40)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tools.guard.check import Verdict, _unreachable, blockers
from tools.guard.hook import CHAINED, HOOK, MARK, GuardError, hook_text, install, uninstall
from tools.guard.project import hooks_dir, project_id, project_of, repo_root, staged_paths

ME, OTHER = b"\x01" * 32, b"\x02" * 32
NOW = 1_000_000


def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def test_install_without_a_hook_and_uninstall_leaves_none(tmp_path: Path) -> None:
    root = repo(tmp_path)
    done = install(root)
    assert done.chained is None and MARK in done.hook.read_text()
    assert os.access(done.hook, os.X_OK)
    uninstall(root)
    assert not (hooks_dir(root) / HOOK).exists()


def test_an_existing_hook_is_chained_and_restored_byte_for_byte(tmp_path: Path) -> None:
    root = repo(tmp_path)
    hook = hooks_dir(root) / HOOK
    old = b"#!/bin/sh\r\n# odd bytes \xff\xfe kept\nexit 0\n"
    hook.write_bytes(old)
    hook.chmod(0o700)
    done = install(root, fail_closed=1)
    assert done.chained == hooks_dir(root) / CHAINED
    assert done.chained.read_bytes() == old
    assert "--fail-closed" in hook.read_text()
    install(root)  # again: ours rewritten, the chained one untouched
    assert "--fail-closed" not in hook.read_text()
    assert (hooks_dir(root) / CHAINED).read_bytes() == old
    uninstall(root)
    assert hook.read_bytes() == old and hook.stat().st_mode & 0o777 == 0o700
    assert not (hooks_dir(root) / CHAINED).exists()


def test_never_over_another_hook(tmp_path: Path) -> None:
    root = repo(tmp_path)
    hooks = hooks_dir(root)
    (hooks / HOOK).write_text("#!/bin/sh\nexit 0\n")
    (hooks / CHAINED).write_text("#!/bin/sh\nexit 1\n")
    with pytest.raises(GuardError):
        install(root)
    assert (hooks / HOOK).read_text() == "#!/bin/sh\nexit 0\n"
    with pytest.raises(GuardError):
        uninstall(root)  # not ours: left alone
    assert (hooks / HOOK).read_text() == "#!/bin/sh\nexit 0\n"


def test_the_hook_honours_core_hooks_path(tmp_path: Path) -> None:
    root = repo(tmp_path)
    subprocess.run(["git", "-C", str(root), "config", "core.hooksPath", "githooks"], check=True)
    done = install(root)
    assert done.hook == root / "githooks" / HOOK


def test_the_hook_text_quotes_what_it_runs() -> None:
    text = hook_text(python="/opt/my python/bin/python", project="team app")
    assert "'/opt/my python/bin/python' -P -m tools.guard.command check" in text
    assert "--project 'team app'" in text and "--no-verify" in text
    assert text.splitlines()[1] == MARK


def test_staged_paths_and_project(tmp_path: Path) -> None:
    root = repo(tmp_path)
    (root / "a").mkdir()
    (root / "a" / "x.py").write_text("x")
    subprocess.run(["git", "-C", str(root), "add", "a/x.py"], check=True)
    assert staged_paths(root) == ["a/x.py"]
    assert repo_root(root / "a") == root.resolve() or repo_root(root / "a") == root
    with pytest.raises(Exception, match="origin"):
        project_of(root)
    subprocess.run(
        ["git", "-C", str(root), "remote", "add", "origin", "https://GitHub.com/O/R.git"],
        check=True,
    )
    assert project_of(root) == "github.com/O/R"
    assert project_id("git@github.com:O/R.git") == "github.com/O/R"
    assert project_id("team-app") == "team-app"


def row(
    holder: bytes, path: str, exclusive: int = 1, expires: int = NOW + 1000
) -> dict[str, object]:
    return {
        "holder": holder.hex(),
        "holder_name": "them",
        "path": path,
        "exclusive": exclusive,
        "reason": "busy",
        "expires_ms": expires,
    }


def test_only_another_holders_live_exclusive_reservation_blocks() -> None:
    staged = ["src/auth/login.py", "README.md"]
    assert blockers(staged, [row(ME, "src/auth/**")], ME, NOW) == []  # own
    assert blockers(staged, [row(OTHER, "src/auth/**", exclusive=0)], ME, NOW) == []  # shared
    assert blockers(staged, [row(OTHER, "src/auth/**", expires=NOW)], ME, NOW) == []  # expired
    assert blockers(staged, [row(OTHER, "docs/**")], ME, NOW) == []  # elsewhere
    [line] = blockers(staged, [row(OTHER, "src/auth/**")], ME, NOW)
    assert "src/auth/login.py" in line and "them" in line and "busy" in line


def test_unreachable_is_open_by_default_and_closed_on_request() -> None:
    assert _unreachable("down", 0) == Verdict(0, _unreachable("down", 0).message)
    assert "warning" in _unreachable("down", 0).message
    closed = _unreachable("down", 1)
    assert closed.code == 1 and "--no-verify" in closed.message
