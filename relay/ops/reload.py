"""SIGHUP: apply what can change while the station runs; name what needs a restart.

``reload(station, old, new)`` compares two parsed option sets (the command line over the config
file, before and after) and changes the running station in place for the keys in
``RELOADABLE``: the per-connection rates and quotas (the policy, and every open connection's
token buckets, so no client is dropped), the log level, the realms' sweep interval, and a fresh
read of the allowlist file. Every other changed key is logged as needing a restart and left as
it was. Pure of I/O besides the log and the allowlist read.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import Any

from relay.station.station import Station

log = logging.getLogger("macula.relay")

QUOTA_KEYS = (
    "publish_rate",
    "call_rate",
    "max_subscriptions",
    "max_advertisements",
    "max_pending_calls",
    "max_streams",
    "max_outbound_bytes",
)
RELOADABLE = frozenset({*QUOTA_KEYS, "log_level", "realm_sweep_ms", "allowlist"})
NOT_OPTIONS = frozenset({"config", "print_config"})


def _key(dest: str) -> str:
    return dest.replace("_", "-")


def changed(old: argparse.Namespace, new: argparse.Namespace) -> dict[str, tuple[Any, Any]]:
    """``dest -> (old, new)`` of every option whose value differs."""
    before, after = vars(old), vars(new)
    return {
        dest: (before.get(dest), value)
        for dest, value in after.items()
        if dest not in NOT_OPTIONS and before.get(dest) != value
    }


def _apply_quotas(station: Station, new: argparse.Namespace) -> None:
    """The new quotas and sweep interval, through the core (``RouterCore.reconfigure``)."""
    policy = station.core.policy
    quotas = dataclasses.replace(
        policy.quotas,
        **{name: getattr(new, name) for name in QUOTA_KEYS},
        publish_burst=new.publish_rate * 2,
        call_burst=new.call_rate * 2,
    )
    policy = dataclasses.replace(policy, quotas=quotas, realm_sweep_ms=new.realm_sweep_ms)
    station.core.reconfigure(policy)
    station.config.policy = policy


def reload(station: Station, old: argparse.Namespace, new: argparse.Namespace) -> list[str]:
    """Apply ``new`` over ``old``; the options (dests) that need a restart (logged, not
    applied)."""
    differences = changed(old, new)
    live = {dest: pair for dest, pair in differences.items() if dest in RELOADABLE}
    restart = sorted(dest for dest in differences if dest not in RELOADABLE)
    if "allowlist" in live:
        restart.append("allowlist")  # a different file: the admission rule holds the old one
        del live["allowlist"]
    _apply_quotas(station, new)
    logging.getLogger().setLevel(new.log_level.upper())
    if station.allowlist is not None:
        station.allowlist.reload()  # the same file, read again now
    for dest, (before, after) in sorted(live.items()):
        log.info("reloaded %s: %s -> %s", _key(dest), before, after)
    if restart:
        shown = ", ".join(sorted(_key(dest) for dest in restart))
        log.warning("changed but needs a restart (kept as it was): %s", shown)
    if not live and not restart:
        log.info("reloaded: nothing changed")
    return sorted(restart)
