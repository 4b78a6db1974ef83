"""Identities for tests: ``hardened(n)`` is puzzle-valid and the same on every run (sans-I/O
tests that compare bytes); ``new_identity()`` is a fresh random one."""

from __future__ import annotations

import os
import random
from pathlib import Path

from macula.keyfile import load_or_create_identity, save_identity
from macula.wire.identity import Identity


def hardened(n: int) -> Identity:
    """A puzzle-valid identity, the same on every run."""
    return Identity.generate(random.Random(n).randbytes)


def new_identity() -> Identity:
    """A fresh random identity."""
    return Identity.generate(os.urandom)


def agent_home(tmp_path: Path, name: str, endpoint: str) -> tuple[dict[str, str], bytes]:
    """A fresh ``MACULA_HOME`` named ``name`` with its own identity, on ``endpoint``: the
    environment a ``macula-mcp`` of that home runs with, and its node id."""
    root = tmp_path / name
    root.mkdir()
    save_identity(root / "id.key", new_identity())
    env = {
        "MACULA_HOME": str(root),
        "MACULA_MESH_STATIONS": endpoint,
        "MACULA_MCP_IDENTITY": str(root / "id.key"),
        "MACULA_MCP_OPERATOR_NAME": name,
    }
    return env, load_or_create_identity(root / "id.key").node_id
