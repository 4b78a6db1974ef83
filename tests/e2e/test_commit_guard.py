"""The commit guard with real ``git``, a real station subprocess and two agents of two homes
(issue 40): two clones of one repository; A reserves ``src/auth/**`` exclusively; B's commit
touching ``src/auth/login.py`` is refused naming A, B's commit elsewhere passes, and after A's
release it passes. Station stopped: a warning and the commit passes; ``--fail-closed``: refused.
The hook that was there before is chained, and put back byte for byte."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from macula.agent.petnames import petname
from support.identities import agent_home
from support.processkit import StationProcess, free_udp_port
from tools.guard.hook import CHAINED
from tools.server.server import build_server

pytestmark = pytest.mark.anyio

ORIGIN_URL = "git@example.org:Team/App.git"
OLD_HOOK = (
    b'#!/bin/sh\n# the team\'s own hook\necho ran >> "$(git rev-parse --git-dir)/old-hook-ran"\n'
)


def git(
    repo: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, timeout=60
    )


def git_env(tmp_path: Path, home: dict[str, str]) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "MACULA_"))}
    return (
        keep
        | home
        | {
            "HOME": str(tmp_path),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_NAME": "b",
            "GIT_AUTHOR_EMAIL": "b@example.org",
            "GIT_COMMITTER_NAME": "b",
            "GIT_COMMITTER_EMAIL": "b@example.org",
        }
    )


def clones(tmp_path: Path, env: dict[str, str]) -> tuple[Path, Path]:
    bare = tmp_path / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True, env=env)
    made = []
    for name in ("clone_a", "clone_b"):
        clone = tmp_path / name
        subprocess.run(["git", "clone", "-q", str(bare), str(clone)], check=True, env=env)
        assert git(clone, "remote", "set-url", "origin", ORIGIN_URL, env=env).returncode == 0
        made.append(clone)
    return made[0], made[1]


def guard(repo: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.cli", "guard", *args, "--repo", str(repo)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def commit(repo: Path, env: dict[str, str], path: str) -> subprocess.CompletedProcess[str]:
    git(repo, "reset", "-q", env=env)
    target = repo / path
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a") as file:
        file.write("one more line\n")
    assert git(repo, "add", path, env=env).returncode == 0
    return git(repo, "commit", "-q", "-m", f"touch {path}", env=env)


async def tool(client: Client, name: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(name, {"project": ORIGIN_URL} | args)
    assert not result.is_error, result.structured_content
    return dict(result.structured_content or {})


async def test_the_guard_refuses_a_commit_on_paths_another_agent_holds(tmp_path: Path) -> None:
    station = StationProcess(tmp_path / "station")
    endpoint = await station.start()
    try:
        env_a, alice = agent_home(tmp_path, "alice", endpoint)
        env_b, _ = agent_home(tmp_path, "bob", endpoint)
        b_env = git_env(tmp_path, env_b)
        _, clone_b = clones(tmp_path, b_env)
        hooks = clone_b / ".git" / "hooks"
        (hooks / "pre-commit").write_bytes(OLD_HOOK)
        (hooks / "pre-commit").chmod(0o750)
        installed = guard(clone_b, b_env, "install")
        assert installed.returncode == 0, installed.stderr
        assert (hooks / CHAINED).read_bytes() == OLD_HOOK
        async with Client(build_server(env_a)) as a:
            await tool(
                a, "mesh_reserve_paths", {"paths": ["src/auth/**"], "reason": "auth rewrite"}
            )
            refused = await anyio.to_thread.run_sync(commit, clone_b, b_env, "src/auth/login.py")
            assert refused.returncode != 0
            for said in (petname(alice), "alice", "src/auth/**", "auth rewrite", "--no-verify"):
                assert said in refused.stderr, refused.stderr
            elsewhere = await anyio.to_thread.run_sync(commit, clone_b, b_env, "README.md")
            assert elsewhere.returncode == 0, elsewhere.stderr
            assert (clone_b / ".git" / "old-hook-ran").read_text().count("ran") == 1  # chained
            await tool(a, "mesh_release_paths", {})
            released = await anyio.to_thread.run_sync(commit, clone_b, b_env, "src/auth/login.py")
            assert released.returncode == 0, released.stderr
            await tool(a, "mesh_reserve_paths", {"paths": ["src/auth/**"]})
        await station.kill()
        # the station stopped: fail open, with a warning
        warned = await anyio.to_thread.run_sync(commit, clone_b, b_env, "src/auth/login.py")
        assert warned.returncode == 0, warned.stderr
        assert "warning" in warned.stderr
        # --fail-closed: refused
        assert guard(clone_b, b_env, "install", "--fail-closed").returncode == 0
        closed = await anyio.to_thread.run_sync(commit, clone_b, b_env, "src/auth/login.py")
        assert closed.returncode != 0 and "--fail-closed" in closed.stderr
        # uninstall: the old hook is back, byte for byte and with its mode
        removed = guard(clone_b, b_env, "uninstall")
        assert removed.returncode == 0, removed.stderr
        assert (hooks / "pre-commit").read_bytes() == OLD_HOOK
        assert (hooks / "pre-commit").stat().st_mode & 0o777 == 0o750
        assert not (hooks / CHAINED).exists()
    finally:
        await station.kill()


def test_a_repository_with_its_own_tools_package_runs_our_check(tmp_path: Path) -> None:
    """git runs the hook in the repository's root; a ``tools/`` package there (common) must not
    shadow ours, nor get its ``tools/guard/command.py`` run: the station is unreachable here,
    so our check lets the commit through with its warning."""
    home, _ = agent_home(tmp_path, "b", f"127.0.0.1:{free_udp_port()}")
    env = git_env(tmp_path, home)
    root = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(root)], check=True, env=env)
    assert git(root, "remote", "add", "origin", ORIGIN_URL, env=env).returncode == 0
    (root / "tools" / "guard").mkdir(parents=True)
    for name in ("tools/__init__.py", "tools/guard/__init__.py"):
        (root / name).write_text("")
    (root / "tools" / "guard" / "command.py").write_text("raise SystemExit('shadowed')\n")
    assert guard(root, env, "install").returncode == 0
    done = commit(root, env, "src/app.py")
    assert done.returncode == 0, done.stderr
    assert "shadowed" not in done.stderr, done.stderr
    assert "macula guard: warning" in done.stderr and "the commit goes on" in done.stderr
