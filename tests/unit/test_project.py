"""Project-level guarantees: committed vectors equal the shared ones; the layer rule holds."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import REPO
from support.vectorkit import VECTORS

SHARED_VECTORS = REPO.parent / "shared" / "vectors"
VECTOR_FILES = ("cbor.json", "frames.json", "identity.json", "content.json", "records.json")


@pytest.mark.parametrize("name", VECTOR_FILES)
def test_committed_vectors_are_present(name: str) -> None:
    assert (VECTORS / name).is_file()


@pytest.mark.skipif(not SHARED_VECTORS.is_dir(), reason="no ../shared/vectors next to this clone")
@pytest.mark.parametrize("name", VECTOR_FILES)
def test_committed_vectors_equal_the_shared_ones(name: str) -> None:
    assert (VECTORS / name).read_bytes() == (SHARED_VECTORS / name).read_bytes(), (
        f"tests/vectors/{name} differs from ../shared/vectors/{name}: copy the shared file"
    )


def test_import_contracts_hold() -> None:
    """DESIGN.md §2 as import-linter contracts (pyproject.toml [tool.importlinter])."""
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    done = subprocess.run(
        [exe, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
