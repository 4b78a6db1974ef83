"""The ``--help`` layout shared by ``macula-mcp``, ``macula-relay`` and ``macula-realm``.

- a description or epilog line that starts with a space is kept as written (examples,
  commands to copy); the other lines are paragraphs (up to a blank or indented line), wrapped
  to the terminal's width;
- every option's default is shown at the end of its help, as ``(default X)`` (``none`` when
  unset, ``off`` for a switch), unless the help already says its default in its own words.
"""

from __future__ import annotations

import argparse
import textwrap


class HelpFormatter(argparse.HelpFormatter):
    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines: list[str] = []
        paragraph: list[str] = []

        def flush() -> None:
            if paragraph:
                joined = " ".join(paragraph)
                lines.extend(
                    textwrap.fill(
                        joined, width, initial_indent=indent, subsequent_indent=indent
                    ).splitlines()
                )
                paragraph.clear()

        for line in text.splitlines():
            if line.strip() and not line.startswith(" "):
                paragraph.append(line.strip())
                continue
            flush()
            lines.append(indent + line)
        flush()
        return "\n".join(lines)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "default" in text or default is argparse.SUPPRESS or not action.option_strings:
            return text
        if action.nargs == 0:  # a switch
            shown = "on" if default else "off"
        elif default is None or default == []:
            shown = "none"
        else:
            shown = f"{default:g}" if isinstance(default, float) else str(default)
        return f"{text} (default {shown.replace('%', '%%')})".lstrip()
