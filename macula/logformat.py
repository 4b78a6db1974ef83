"""Log line formats shared by the station (``macula-relay``) and ``macula-mcp``.

``KeyValueFormatter`` (the default): one line per record, ``ts=... level=... logger=...
msg="..."`` (double quotes in the message become single ones).

``JsonFormatter`` (``macula-relay --log-format json``): a JSON line is one object: ``ts``
(ISO 8601, UTC, milliseconds), ``level``, ``logger``, ``msg``, and ``exc`` when an exception is
logged; nothing else from the record is copied, so no argument a peer chose lands in a field
of its own.
"""

from __future__ import annotations

import json
import logging
import time


class KeyValueFormatter(logging.Formatter):
    """One line per record: ``ts=... level=... logger=... msg="..."``."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage().replace('"', "'")
        line = (
            f"ts={self.formatTime(record, '%Y-%m-%dT%H:%M:%S')} level={record.levelname.lower()} "
            f'logger={record.name} msg="{message}"'
        )
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line: dict[str, str] = {
            "ts": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)
