"""Reading and editing one named server entry in a harness's configuration text, per format.

Invariants:
- every operation takes text and returns text: no file access here (``tools/harness/register.py``
owns
  files, backups and atomic writes).
- a text that does not parse raises ``ConfigParseError`` with the parser's own words; nothing
  is edited then.
- JSON and JSONC are edited surgically (``tools/harness/json_text.py``): bytes outside the entry
stay.
  YAML goes through ruamel.yaml's round trip, which keeps comments, key order and quoting; the
  document's indentation is guessed and reused.
- TOML is read with the standard library's strict parser (``tomllib``, TOML 1.0, as strict as
  Codex's own). A server is written as a ``[<path>.<name>]`` table (maps in it, ``env``, as
  inline tables) appended at the end of the text after one blank line: every byte before it
  stays, and taking it off the end gives them back. An entry anywhere else (written by hand,
  or followed by later edits) is taken out with tomlkit, which keeps comments and layout.
  Every TOML edit is checked by parsing its result: the data must be the old data with just
  that one server added or removed.
- ``with_entry(None, ...)`` is the whole text of a file that did not exist before.
"""

from __future__ import annotations

import contextlib
import copy
import io
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from tools.harness import json_text


class ConfigParseError(ValueError):
    """The configuration text does not parse; the message says where and why."""


class ConfigFormat(Protocol):
    @property
    def kind(self) -> str: ...

    def read_entry(self, text: str, name: str) -> Any: ...

    def with_entry(self, text: str | None, name: str, entry: Mapping[str, Any]) -> str: ...

    def without_entry(self, text: str, name: str) -> str: ...


@dataclass(frozen=True)
class JsonFormat:
    """Servers under ``path(root)`` of a JSON object (opencode's path depends on the file)."""

    path: Callable[[Mapping[str, Any]], tuple[str, ...]]
    jsonc: bool

    @property
    def kind(self) -> str:
        return "JSONC" if self.jsonc else "JSON"

    def _root(self, text: str) -> Mapping[str, Any]:
        try:
            root = json_text.parse(text, jsonc=self.jsonc).value
        except json_text.JsonTextError as exc:
            raise ConfigParseError(f"not valid {self.kind}: {exc}") from None
        if not isinstance(root, dict):
            raise ConfigParseError(f"not a {self.kind} object at the top level")
        return root

    def read_entry(self, text: str, name: str) -> Any:
        if not text.strip():  # an empty file (some editors create one): no servers yet
            return None
        root = self._root(text)
        try:
            return json_text.member_value(text, self.path(root), name, jsonc=self.jsonc)
        except json_text.JsonTextError as exc:
            raise ConfigParseError(str(exc)) from None

    def with_entry(self, text: str | None, name: str, entry: Mapping[str, Any]) -> str:
        if text is None or not text.strip():
            return json_text.new_document(self.path({}), name, dict(entry))
        path = self.path(self._root(text))
        try:
            return json_text.set_member(text, path, name, dict(entry), jsonc=self.jsonc)
        except json_text.JsonTextError as exc:
            raise ConfigParseError(str(exc)) from None

    def without_entry(self, text: str, name: str) -> str:
        path = self.path(self._root(text))
        try:
            return json_text.remove_member(text, path, name, jsonc=self.jsonc)
        except json_text.JsonTextError as exc:
            raise ConfigParseError(str(exc)) from None


def _guess_indent(text: str) -> tuple[int, int, int]:
    """(mapping indent, sequence indent, dash offset) as the document writes them."""
    from ruamel.yaml.util import load_yaml_guess_indent

    mapping = 2
    depths = sorted(
        {
            len(line) - len(line.lstrip(" "))
            for line in text.splitlines()
            if re.match(r"\s+[^\s#-][^:]*:(\s|$)", line)
        }
    )
    if depths:
        mapping = depths[0]
    try:
        _, sequence, offset = load_yaml_guess_indent(text)
    except Exception:  # the real parse below reports the error
        sequence, offset = None, None
    if offset is None:
        return mapping, mapping, 0
    return mapping, sequence or mapping, offset


@dataclass(frozen=True)
class YamlFormat:
    """Servers under ``path`` of a YAML mapping, through a ruamel.yaml round trip."""

    path: tuple[str, ...]
    kind: str = "YAML"

    def _yaml(self, text: str) -> Any:
        from ruamel.yaml import YAML

        yaml = YAML(typ="rt")
        yaml.preserve_quotes = True
        yaml.width = 4096  # never re-wrap a long line
        mapping, sequence, offset = _guess_indent(text)
        yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
        return yaml

    def _load(self, text: str) -> tuple[Any, Any]:
        from ruamel.yaml.error import YAMLError

        yaml = self._yaml(text)
        try:
            data = yaml.load(text)
        except YAMLError as exc:
            raise ConfigParseError(f"not valid YAML: {' '.join(str(exc).split())}") from None
        if data is None:
            from ruamel.yaml.comments import CommentedMap

            data = CommentedMap()
        if not isinstance(data, dict):
            raise ConfigParseError("not a YAML mapping at the top level")
        return yaml, data

    def _container(self, data: Any, create: bool) -> Any:
        from ruamel.yaml.comments import CommentedMap

        node = data
        for depth, key in enumerate(self.path):
            child = node.get(key)
            if child is None:
                if not create:
                    return None
                child = CommentedMap()
                node[key] = child
            if not isinstance(child, dict):
                raise ConfigParseError(f"{'.'.join(self.path[: depth + 1])} is not a mapping")
            node = child
        return node

    def _dump(self, yaml: Any, data: Any) -> str:
        out = io.StringIO()
        yaml.dump(data, out)
        return out.getvalue()

    def read_entry(self, text: str, name: str) -> Any:
        _, data = self._load(text)
        container = self._container(data, create=False)
        if container is None or name not in container:
            return None
        return _plain(container[name])

    def with_entry(self, text: str | None, name: str, entry: Mapping[str, Any]) -> str:
        from ruamel.yaml.comments import CommentedMap

        yaml, data = self._load(text or "")
        container = self._container(data, create=True)
        if name in container and _plain(container[name]) == dict(entry):
            return text or ""
        container[name] = CommentedMap(entry)
        dumped = self._dump(yaml, data)
        if text and text.strip() and len(data) == 1 and not _has_content(text):
            # the document held only comments, which ruamel drops with the empty document
            return text + ("" if text.endswith("\n") else "\n") + dumped
        return dumped

    def without_entry(self, text: str, name: str) -> str:
        yaml, data = self._load(text)
        container = self._container(data, create=False)
        if container is None or name not in container:
            return text
        del container[name]
        return self._dump(yaml, data)


def _has_content(text: str) -> bool:
    """Whether a YAML text holds anything besides comments, blank lines and document markers."""
    for line in text.splitlines():
        bare = line.strip()
        if bare and not bare.startswith("#") and bare not in ("---", "..."):
            return True
    return False


def _plain(value: Any) -> Any:
    """ruamel's commented containers and scalars as plain dicts, lists, str, int, bool."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value


@dataclass(frozen=True)
class TomlFormat:
    """Servers as tables under ``path`` of a TOML document (Codex's ``[mcp_servers.NAME]``)."""

    path: tuple[str, ...]
    kind: str = "TOML"

    def _data(self, text: str) -> dict[str, Any]:
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigParseError(f"not valid TOML: {exc}") from None

    def _servers(self, data: Mapping[str, Any]) -> Mapping[str, Any] | None:
        node: Any = data
        for depth, key in enumerate(self.path):
            node = node.get(key)
            if node is None:
                return None
            if not isinstance(node, dict):
                raise ConfigParseError(f"{'.'.join(self.path[: depth + 1])} is not a table")
        return node  # type: ignore[no-any-return]

    def read_entry(self, text: str, name: str) -> Any:
        servers = self._servers(self._data(text))
        return None if servers is None else servers.get(name)

    def _table(self, name: str, entry: Mapping[str, Any], eol: str) -> str:
        """The server's ``[path.name]`` table as text, lines ending in ``eol``."""
        import tomlkit

        table = tomlkit.table()
        for key, value in entry.items():
            table.append(key, _toml_inline(value) if isinstance(value, Mapping) else value)
        node: Any = tomlkit.table(is_super_table=True)
        document, outer = tomlkit.document(), node
        for key in self.path[1:]:
            inner = tomlkit.table(is_super_table=True)
            outer.append(key, inner)
            outer = inner
        outer.append(name, table)
        document.append(self.path[0], node)
        return tomlkit.dumps(document).replace("\n", eol)

    def _block(self, text: str, name: str, entry: Mapping[str, Any]) -> str:
        """What ``with_entry`` appends to ``text``: a separator and the server's table, in the
        text's own line endings."""
        eol = "\r\n" if "\r\n" in text else "\n"
        rendered = self._table(name, entry, eol)
        if not text:
            return rendered
        newline = "" if text.endswith("\n") else eol
        blank = eol if text.strip() else ""
        return newline + blank + rendered

    def with_entry(self, text: str | None, name: str, entry: Mapping[str, Any]) -> str:
        source = text or ""
        data = self._data(source)
        servers = self._servers(data)
        if servers is not None and name in servers:
            if servers[name] == dict(entry):
                return source
            source = self.without_entry(source, name)
            data = self._data(source)
        after = source + self._block(source, name, entry)
        self._check(after, data, name, dict(entry))
        return after

    def without_entry(self, text: str, name: str) -> str:
        data = self._data(text)
        servers = self._servers(data)
        if servers is None or name not in servers:
            return text
        entry = servers[name]
        rendered = self._table(name, entry, "\r\n" if "\r\n" in text else "\n")
        if text.endswith(rendered):  # our own block at the end: take it off, byte for byte
            base = text[: len(text) - len(rendered)]
            cuts = (base[:-2], base, base[:-4]) if rendered.endswith("\r\n") else ()
            for prefix in cuts or (base[:-1], base, base[:-2]):  # less the separator _block adds
                if prefix + self._block(prefix, name, entry) == text:
                    with contextlib.suppress(ConfigParseError):
                        if self.read_entry(prefix, name) is None:
                            return prefix
        return self._remove_with_tomlkit(text, name)

    def _remove_with_tomlkit(self, text: str, name: str) -> str:
        import tomlkit
        from tomlkit.exceptions import TOMLKitError

        try:
            document = tomlkit.parse(text)
            node: Any = document
            for key in self.path:
                node = node[key]
            del node[name]
            after = tomlkit.dumps(document)
        except (TOMLKitError, KeyError, TypeError) as exc:
            raise ConfigParseError(f"cannot take '{name}' out of this TOML: {exc}") from None
        expected = self._data(text)
        servers: Any = expected
        for key in self.path:
            servers = servers[key]
        del servers[name]
        if self._pruned(self._data(after)) != self._pruned(expected):
            raise ConfigParseError(f"taking '{name}' out would change other settings")
        return after

    def _pruned(self, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` without the servers' table when it is empty (absent and empty agree)."""
        if self._servers(data) == {}:
            pruned = copy.deepcopy(data)
            node = pruned
            for key in self.path[:-1]:
                node = node[key]
            del node[self.path[-1]]
            return pruned
        return data

    def _check(self, after: str, before: dict[str, Any], name: str, entry: Any) -> None:
        expected = copy.deepcopy(before)
        node = expected
        for key in self.path:
            node = node.setdefault(key, {})
        node[name] = entry
        try:
            ok = self._data(after) == expected
        except ConfigParseError:
            ok = False
        if not ok:
            where = ".".join(self.path)
            raise ConfigParseError(
                f"cannot add a [{where}.{name}] table to this TOML ({where} is written in a way "
                "a table cannot extend, such as an inline table); add the entry by hand"
            )


def _toml_inline(value: Mapping[str, Any]) -> Any:
    import tomlkit

    table = tomlkit.inline_table()
    for key, item in value.items():
        table.append(key, _toml_inline(item) if isinstance(item, Mapping) else item)
    return table
