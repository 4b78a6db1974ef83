"""The handshake card shipped with the package: the server's ``initialize`` answers, made ahead.

The front (``tools.stdio.front``) answers the opening request from a card it learned in
``$MACULA_HOME``; in a brand-new home there is none yet, and the first spawn used to wait for the
SDK (4.75 s measured). ``handshake_seed.json`` next to this module holds, for each channel
setting and each handshake version the SDK agrees to, the answer this code gives, computed the
way the SDK computes it (``mcp.server.runner``: negotiated version, the initialization options'
capabilities, server info and instructions, then the per-version sieve) from the real
``build_server``, no runtime opened.

Invariants: the file is made only by ``python -m tools.stdio.handshake_seed`` (never by hand);
``tests/unit/tools/stdio/test_handshake_seed.py`` fails when it differs from what the code answers
now, and
``tests/e2e/test_mcp_eras.py`` checks it equals what a real server process says; the front uses
it only when the installed ``mcp`` is the version it was made with, and a backend reply that
differs from it is relearned (the front's usual stale-card rule).
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from typing import Any

from mcp.types import Implementation, InitializeResult
from mcp_types import methods

from tools.server.server import build_server
from tools.settings import CHANNEL_ENV, TERSE_TOOLS_ENV
from tools.stdio.front import HANDSHAKE_VERSIONS, SEED_FILE


def answers(channel: str) -> dict[str, Any]:
    """``{"initialize V": result}`` for every handshake version, channel push on ("1") or off."""
    app = build_server({CHANNEL_ENV: channel, TERSE_TOOLS_ENV: "0"})
    options = app._lowlevel_server.create_initialization_options()
    made: dict[str, Any] = {}
    for version in HANDSHAKE_VERSIONS:
        result = InitializeResult(
            protocol_version=version,
            capabilities=options.capabilities,
            server_info=Implementation(
                name=options.server_name,
                title=options.title,
                description=options.description,
                version=options.server_version,
                website_url=options.website_url,
                icons=options.icons,
            ),
            instructions=options.instructions,
        )
        dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        # the SDK's per-version sieve, as its runner applies it to every result it sends
        made[f"initialize {version}"] = methods.serialize_server_result(
            "initialize", version, dumped
        )
    return made


def seed() -> dict[str, Any]:
    return {
        "mcp": importlib.metadata.version("mcp"),
        "channel": {setting: answers(setting) for setting in ("1", "0")},
    }


def main() -> None:
    text = json.dumps(seed(), indent=1, sort_keys=True) + "\n"
    SEED_FILE.write_text(text, encoding="utf-8")
    print(f"wrote {SEED_FILE}", file=sys.stderr)


if __name__ == "__main__":
    main()
