"""The ``--help`` layout shared by ``macula-mcp``, ``macula-relay`` and ``macula-realm``.

- a description or epilog line that starts with a space is kept as written (examples,
  commands to copy); every other line is wrapped to the terminal's width;
- an option's default is shown at the end of its help, as ``(default X)``, unless the help
  already says its default, the default is ``None`` (the help says what happens then) or the
  option is a switch (``store_true``: off unless given).
"""

from __future__ import annotations

import argparse
import textwrap


class HelpFormatter(argparse.HelpFormatter):
    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines: list[str] = []
        for line in text.splitlines():
            if not line.strip() or line.startswith(" "):
                lines.append(indent + line)
            else:
                lines.extend(
                    textwrap.fill(
                        line, width, initial_indent=indent, subsequent_indent=indent
                    ).splitlines()
                )
        return "\n".join(lines)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is argparse.SUPPRESS
            or action.nargs == 0
            or not action.option_strings
            or default == []
        ):
            return text
        shown = f"{default:g}" if isinstance(default, float) else str(default)
        return f"{text} (default {shown.replace('%', '%%')})".lstrip()
