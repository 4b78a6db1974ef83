"""Errors the client library raises, named by who caused them (STYLE.md: Closed vs Broken).

- ``MeshError``: the mesh answered with an ERROR frame (code, name, detail, retryable).
- ``CallTimeout``: no answer before the caller's timeout.
- ``ClosedError``: *we* closed the node or session; nothing will reconnect it.
- ``BrokenError``: the connection or the peer failed; the node reconnects on its own.
- ``HandshakeError``: the station refused us or could not prove who it is.
- ``ConfigError``: a setting (argument or environment variable) is invalid; names it.
"""

from __future__ import annotations

from macula.wire.codes import code_name, is_retryable


class MaculaError(Exception):
    """Base of every error the client library raises on purpose."""

    retryable = False


class MeshError(MaculaError):
    def __init__(self, code: int, detail: str | None = None, name: str | None = None) -> None:
        self.code = code
        self.name = name or code_name(code)
        self.detail = detail
        self.retryable = is_retryable(code)
        text = f"{self.name} (0x{code:02x})"
        super().__init__(f"{text}: {detail}" if detail else text)


class CallTimeout(MaculaError, TimeoutError):
    retryable = True


class ClosedError(MaculaError):
    """The node (or session) was closed by its owner."""


class BrokenError(MaculaError):
    """The connection to the station failed; the node is reconnecting."""

    retryable = True


class HandshakeError(MaculaError):
    """The station refused us (``refusal_code``, §5.4) or could not prove its identity."""

    def __init__(
        self, message: str, refusal_code: int | None = None, *, retryable: bool | None = None
    ) -> None:
        self.refusal_code = refusal_code
        if retryable is None:
            retryable = refusal_code is None or is_retryable(refusal_code)
        self.retryable = retryable
        super().__init__(message)


class ConfigError(MaculaError, ValueError):
    """A setting is invalid; the message names the setting and what is wrong."""
