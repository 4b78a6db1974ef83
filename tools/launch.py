"""How to start ``macula-mcp`` as a subprocess (for ``mcp-config``, ``doctor``, the demo and
tests): absolute paths, so the command works from any working directory."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def server_command() -> list[str]:
    """The ``macula-mcp`` script on PATH or beside this interpreter, else ``-m tools.cli``."""
    script = shutil.which("macula-mcp") or str(Path(sys.executable).with_name("macula-mcp"))
    if Path(script).exists():
        return [str(Path(script).resolve())]
    return [sys.executable, "-m", "tools.cli"]
