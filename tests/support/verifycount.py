"""Counting the Ed25519 verifies libsodium makes: ``verifies`` (tests/unit/conftest.py) patches
``nacl.bindings.crypto_sign_open`` for one test; ``with verifies.on():`` counts from zero."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import nacl.bindings
import pytest


class Verifies:
    """Ed25519 verifies libsodium made while ``counting``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        self.counting = False
        verify = nacl.bindings.crypto_sign_open

        def counted(*args: Any, **kw: Any) -> Any:
            self.n += self.counting
            return verify(*args, **kw)

        monkeypatch.setattr(nacl.bindings, "crypto_sign_open", counted)

    @contextmanager
    def on(self) -> Iterator[None]:
        self.n, self.counting = 0, True
        try:
            yield
        finally:
            self.counting = False
