"""Who may run a command served with ``mesh_serve``, how often, and what it sees of this machine.

Invariants:
- a served command's environment is ``PASSED_ENV`` taken from this server's environment (those
  set) plus ``MACULA_CALLER`` (hex node id), ``MACULA_PROCEDURE`` and ``MACULA_REALM`` (hex) of
  the call; nothing else of the harness's environment (API keys live there) reaches it;
- ``allow="allowlist"`` admits only node ids on this agent's contact allowlist, read on every
  call (``mesh_trust_agent`` adds one at once); ``"open"`` admits every caller; ``"owner"``
  admits every caller to the owner's approval queue (``tools.groups.owner.served_calls``): the
  command runs only once the owner approved that call;
- each caller has a token bucket per served procedure: ``rate_per_minute`` tokens a minute, at
  most a minute's worth banked; a call without a token is refused with the wait in ms. At most
  ``MAX_TRACKED_CALLERS`` buckets are kept: buckets that have refilled are forgotten first
  (forgetting them changes nothing), else the least recently used;
- ``ServeGate.check`` decides without side effects other than spending the caller's token; the
  refusal text is meant for the caller and names what to do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from macula.agent.contact_policy import PolicyState
from macula.clock import now_ms
from macula.rate import TokenBucket
from tools.settings import CALLER_ENV, PROCEDURE_ENV, REALM_ENV

PASSED_ENV: Final = ("PATH", "HOME", "LANG", "TMPDIR")
ALLOW_MODES: Final = ("open", "allowlist", "owner")
DEFAULT_RATE_PER_MINUTE: Final = 60
MAX_RATE_PER_MINUTE: Final = 6000
MAX_TRACKED_CALLERS: Final = 10_000


def command_env(
    server_env: Mapping[str, str], caller: bytes, procedure: str, realm: bytes
) -> dict[str, str]:
    """The whole environment of one run of a served command (see the module docstring)."""
    env = {name: server_env[name] for name in PASSED_ENV if name in server_env}
    env |= {CALLER_ENV: caller.hex(), PROCEDURE_ENV: procedure, REALM_ENV: realm.hex()}
    return env


class CallerBuckets:
    """One ``TokenBucket`` per caller: ``per_minute`` tokens a minute, a minute's worth banked."""

    def __init__(self, per_minute: int, *, max_tracked: int = MAX_TRACKED_CALLERS) -> None:
        if not (per_minute >= 1 and max_tracked >= 1):
            raise ValueError("per_minute and max_tracked must be >= 1")
        self.rate = per_minute / 60.0  # tokens a second
        self.burst = float(per_minute)
        self.max_tracked = max_tracked
        self._buckets: dict[bytes, TokenBucket] = {}  # least recently used first

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, caller: bytes, now: int) -> int:
        """Spend one of ``caller``'s tokens: 0 if done, else the ms until one is available."""
        bucket = self._buckets.pop(caller, None)
        if bucket is None:
            if len(self._buckets) >= self.max_tracked:
                self._forget(now)
            bucket = TokenBucket(self.rate, self.burst, now)
        self._buckets[caller] = bucket
        if bucket.take(now):
            return 0
        return max(1, math.ceil((1.0 - bucket.tokens(now)) / self.rate * 1000))

    def _forget(self, now: int) -> None:
        full = [key for key, bucket in self._buckets.items() if bucket.tokens(now) >= self.burst]
        for key in full or [next(iter(self._buckets))]:
            del self._buckets[key]


@dataclass
class ServeGate:
    """The admission rules of one served procedure."""

    procedure: str
    rate_per_minute: int = DEFAULT_RATE_PER_MINUTE
    allow: str = "open"
    policy: Callable[[], PolicyState] | None = None  # the contact policy (allowlist) in force
    clock: Callable[[], int] = now_ms
    buckets: CallerBuckets = field(init=False)

    def __post_init__(self) -> None:
        if self.allow not in ALLOW_MODES:
            raise ValueError(f"allow must be one of {', '.join(ALLOW_MODES)}")
        if self.allow == "allowlist" and self.policy is None:
            raise ValueError("allow='allowlist' needs the contact policy")
        self.buckets = CallerBuckets(self.rate_per_minute)

    def check(self, caller: bytes) -> tuple[str, str] | None:
        """None when ``caller`` may run the command now, else ``(counter, reason)``."""
        if self.allow == "allowlist" and not self._listed(caller):
            return "refused", (
                f"not_allowed: {self.procedure} serves only callers on its operator's "
                f"allowlist; ask them to trust your node id {caller.hex()}"
            )
        wait_ms = self.buckets.take(caller, self.clock())
        if wait_ms:
            return "rate_limited", (
                f"rate_limited: at most {self.rate_per_minute} calls a minute of "
                f"{self.procedure} per caller; retry in {wait_ms} ms"
            )
        return None

    def _listed(self, caller: bytes) -> bool:
        return self.policy is not None and self.policy().allows(caller)
