"""The ``macula-mcp`` entry point: ``attach`` is dispatched before anything heavy is imported
(it must start in a few tens of milliseconds); every other command goes to ``tools.cli``."""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:2] == ["attach"]:
        from tools.attach import main as attach

        attach(sys.argv[2:])
        return
    from tools.cli import main as cli

    cli()
