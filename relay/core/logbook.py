"""What the station writes to its log about its peers: bounded, whatever a peer sends.

Invariants: a peer-provided value reaches a log line only through ``clip`` (at most
``MAX_LOGGED_CHARS`` characters, control characters escaped; QUIC close reasons are cut to
``macula.quic.transport.MAX_CLOSE_REASON_BYTES`` where the connection is closed); a refused frame
costs a counter, never a line: ``Refusals`` sums them per connection and yields at most one
summary line per ``interval_ms`` (time is an argument), plus one when the connection ends.
"""

from __future__ import annotations

from collections import Counter

MAX_LOGGED_CHARS = 200


def clip(value: object, limit: int = MAX_LOGGED_CHARS) -> str:
    """``value`` as text fit for one log line: printable, at most ``limit`` characters."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > 4 * limit:
        text = text[: 4 * limit]  # escaping below at most quadruples a character
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    if len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


class Refusals:
    """One connection's refused frames: counted, summed up in a line now and then."""

    __slots__ = ("counts", "last_line_ms", "last_why", "noun", "unreported")

    def __init__(self, now_ms: int | None, noun: str = "frame") -> None:
        """``now_ms``: when counting starts (None: not known, the first line is due at once)."""
        self.counts: Counter[str] = Counter()  # every refusal since counting started
        self.unreported: Counter[str] = Counter()  # since the last summary line
        self.last_why = ""
        self.last_line_ms = now_ms
        self.noun = noun

    def count(self, counter: str, why: str) -> None:
        self.counts[counter] += 1
        self.unreported[counter] += 1
        self.last_why = why

    def summary(self, now_ms: int, interval_ms: int, *, final: bool = False) -> str | None:
        """A line summing up what was refused since the last one, or None if it is not due."""
        since = self.last_line_ms
        if not self.unreported or (
            not final and since is not None and now_ms - since < interval_ms
        ):
            return None
        total = sum(self.unreported.values())
        kinds = ", ".join(f"{name}={n}" for name, n in self.unreported.most_common(8))
        span = "" if since is None else f" in {max(0, now_ms - since) / 1000:.0f} s"
        self.unreported.clear()
        self.last_line_ms = now_ms
        last = clip(self.last_why)
        return f"refused {total} {self.noun}(s){span} ({kinds}); last: {last}"
