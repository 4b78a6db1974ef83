"""Fixtures the unit tests share: ``verifies``, Ed25519 verifies counted (support.verifycount)."""

from __future__ import annotations

import pytest

from support.verifycount import Verifies


@pytest.fixture
def verifies(monkeypatch: pytest.MonkeyPatch) -> Verifies:
    return Verifies(monkeypatch)
