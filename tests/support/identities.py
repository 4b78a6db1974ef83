"""Identities for tests: ``hardened(n)`` is puzzle-valid and the same on every run (sans-I/O
tests that compare bytes); ``new_identity()`` is a fresh random one."""

from __future__ import annotations

import os
import random

from macula.wire.identity import Identity


def hardened(n: int) -> Identity:
    """A puzzle-valid identity, the same on every run."""
    return Identity.generate(random.Random(n).randbytes)


def new_identity() -> Identity:
    """A fresh random identity."""
    return Identity.generate(os.urandom)
