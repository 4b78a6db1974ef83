"""The repository's folders, for tests wherever they sit under ``tests/``; a file's mode bits."""

from __future__ import annotations

import stat
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
VECTORS = REPO / "tests" / "vectors"


def file_mode(path: Path) -> int:
    """``path``'s permission bits (``0o600``)."""
    return stat.S_IMODE(path.stat().st_mode)
