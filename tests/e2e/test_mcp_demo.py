"""``macula-mcp demo`` (the README quickstart) passes: two real macula-mcp processes meet."""

from __future__ import annotations

import subprocess
import sys


def test_macula_mcp_demo_passes() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tools.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-1].startswith("demo passed")
    assert not any(line.startswith("FAILED") for line in lines)
    assert any("mesh_ring" in line and "answer 1" in line for line in lines)
