"""The daemon's HTTP token file: made once, private, refused when tampered with."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tools.daemon.http.home_token import TokenFileError, home_token, matches, token_path


def test_made_once_private_and_stable(tmp_path: Path) -> None:
    first = home_token(tmp_path)
    assert len(first) == 43
    assert home_token(tmp_path) == first
    path = token_path(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_readable_by_others_is_refused(tmp_path: Path) -> None:
    home_token(tmp_path)
    os.chmod(token_path(tmp_path), 0o644)
    with pytest.raises(TokenFileError, match="chmod 600"):
        home_token(tmp_path)


def test_garbage_is_refused(tmp_path: Path) -> None:
    home_token(tmp_path)
    token_path(tmp_path).write_text("short\n")
    with pytest.raises(TokenFileError, match="does not hold a token"):
        home_token(tmp_path)


def test_matches_is_exact() -> None:
    token = "a" * 43
    assert matches(token, token)
    assert not matches(None, token)
    assert not matches("", token)
    assert not matches("a" * 42, token)
    assert not matches("é" * 43, token)
