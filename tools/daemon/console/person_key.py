"""The home's person identity: the key a person at the console signs with (``macula.agent.person``).

Invariants:
- it lives at ``$MACULA_HOME/console/person.key`` (0600 in a 0700 folder), made on first use;
  it is never an agent's key, never connects to a station, and no MCP tool reads it;
- no puzzle: it is never presented to a station, only verified by readers of a room.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from macula.keyfile import load_or_create_identity
from macula.wire.identity import Identity

FOLDER: Final = "console"
KEY_NAME: Final = "person.key"


def person_key_path(home: Path) -> Path:
    return home / FOLDER / KEY_NAME


def person_identity(home: Path) -> Identity:
    """The home's person key, made on first use."""
    return load_or_create_identity(person_key_path(home), difficulty=0)
