"""The repository's folders, for tests wherever they sit under ``tests/``."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
VECTORS = REPO / "tests" / "vectors"
