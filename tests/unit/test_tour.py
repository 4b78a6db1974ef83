"""The README quickstart's command works end to end."""

from __future__ import annotations

import subprocess
import sys

from macula.tour import run


def test_tour_passes_every_check_in_process() -> None:
    lines: list[str] = []
    assert run(lines.append) == 0
    assert lines[-1] == "9/9 checks passed"


def test_tour_runs_as_a_program() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "macula.tour"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAIL" not in done.stdout
    assert done.stdout.strip().endswith("9/9 checks passed")
