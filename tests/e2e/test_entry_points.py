"""A bad ``MACULA_QUIC`` (found while the modules are imported, before any argument is parsed)
is one clear stderr line and exit 2 from the installed commands, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(("command", "args"), [("macula-relay", ["--help"]), ("macula-mcp", [])])
def test_a_bad_quic_backend_is_one_line_and_exit_2(command: str, args: list[str]) -> None:
    done = subprocess.run(
        [str(BIN / command), *args],
        env={**os.environ, "MACULA_QUIC": "quick"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.strip() == f"{command}: MACULA_QUIC='quick' is not one of aioquic, qh3"
