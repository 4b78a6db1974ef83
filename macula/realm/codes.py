"""Join codes a person reads off a screen and types into ``macula-realm approve``.

Invariants:
- A code is ``CODE_LENGTH`` characters of ``ALPHABET`` (no 0/O, 1/I/L, no U): 30^8 ≈ 6.6e11
  codes, drawn from the randomness given (never ``random``). Shown as ``ABCD-EFGH``;
  ``normalize`` accepts any case, spaces and dashes, and refuses characters outside the
  alphabet (a typo is a malformed code, said as such, not counted as a guess).
- ``GuessLimiter``: at most ``max_wrong`` wrong codes per ``window_ms`` (defaults 5 per 15 min,
  both configurable); once reached, every lookup is refused until the window has passed, the
  right code included, so guessing the ~1e-11 chance per try cannot be repeated at speed.
- Sans-I/O: time and randomness are arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

ALPHABET: Final = "23456789ABCDEFGHJKMNPQRSTVWXYZ"
CODE_LENGTH: Final = 8
DEFAULT_MAX_WRONG: Final = 5
DEFAULT_WINDOW_MS: Final = 15 * 60 * 1000


def new_code(random_bytes: Callable[[int], bytes]) -> str:
    """A fresh code, uniformly drawn (rejection sampling: no modulo bias)."""
    out: list[str] = []
    limit = 256 - 256 % len(ALPHABET)
    while len(out) < CODE_LENGTH:
        for byte in random_bytes(CODE_LENGTH):
            if byte < limit and len(out) < CODE_LENGTH:
                out.append(ALPHABET[byte % len(ALPHABET)])
    return "".join(out)


def display(code: str) -> str:
    half = CODE_LENGTH // 2
    return f"{code[:half]}-{code[half:]}"


def normalize(text: str) -> str | None:
    """The code in ``text`` (case, spaces and dashes ignored), or None if it cannot be one."""
    if type(text) is not str or len(text) > 4 * CODE_LENGTH:
        return None
    code = "".join(c for c in text.upper() if c not in " -\t")
    if len(code) != CODE_LENGTH or any(c not in ALPHABET for c in code):
        return None
    return code


class GuessLimiter:
    """Counts wrong codes in a sliding window (the timestamps are kept by the caller's store)."""

    def __init__(self, max_wrong: int = DEFAULT_MAX_WRONG, window_ms: int = DEFAULT_WINDOW_MS):
        if max_wrong < 1 or window_ms < 1:
            raise ValueError("max_wrong and window_ms must be positive")
        self.max_wrong = max_wrong
        self.window_ms = window_ms

    def recent(self, wrong_at: list[int], now_ms: int) -> list[int]:
        return [t for t in wrong_at if now_ms - t < self.window_ms]

    def blocked_for_ms(self, wrong_at: list[int], now_ms: int) -> int:
        """0 if a lookup may run now, else how long until it may."""
        recent = sorted(self.recent(wrong_at, now_ms))
        if len(recent) < self.max_wrong:
            return 0
        return recent[-self.max_wrong] + self.window_ms - now_ms
