"""relay.ops.config_file: keys derived from every flag, typed like the command line, errors with
lines, precedence, the printed configuration taken back unchanged."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from relay.ops import config_file
from relay.ops.cli import build_parser, config_from_args

PEER = "ab" * 32 + "@127.0.0.1:4999"
REALM = "org.example.team=" + "cd" * 32


def test_every_long_flag_has_a_key() -> None:
    parser = build_parser()
    keys = config_file.option_keys(parser)
    flags = {
        s[2:]
        for action in parser._actions
        for s in action.option_strings[:1]
        if s.startswith("--") and action.dest not in config_file.NOT_KEYS
    }
    assert set(keys) == flags and len(keys) > 70
    assert {"publish-rate", "no-memory", "peer", "realm", "monitor", "log-format"} <= set(keys)


def test_printed_configuration_has_every_key_and_comes_back(tmp_path: Path) -> None:
    parser = build_parser()
    args = parser.parse_args(["--peer", PEER, "--realm", REALM, "--monitor", "127.0.0.1:0"])
    text = config_file.render(parser, args)
    keys = config_file.option_keys(parser)
    for key in keys:
        assert f"\n{key} =" in text or f"# {key} =" in text, key
    path = tmp_path / "station.toml"
    path.write_text(text)
    again, loaded = config_file.parse(build_parser(), ["--config", str(path)])
    assert config_file.render(build_parser(), again) == text
    assert config_from_args(again) == config_from_args(args)  # the same station
    assert loaded.lines["publish_rate"][1] > 0


def test_values_are_typed_as_on_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        f'publish-rate = 5\nno-history = true\npeer = ["{PEER}"]\ndata-dir = "/srv/m"\n'
        'monitor = "[::1]:8222"\n'
    )
    args, _ = config_file.parse(build_parser(), ["--config", str(path)])
    assert args.publish_rate == 5.0 and isinstance(args.publish_rate, float)
    assert args.no_history is True and args.data_dir == Path("/srv/m")
    assert [p.quic_port for p in args.peer] == [4999] and args.monitor == ("::1", 8222)


def test_flags_win_and_a_repeated_flag_replaces_the_list(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(f'publish-rate = 5\ncall-rate = 7\npeer = ["{PEER}"]\n')
    other = "ef" * 32 + "@127.0.0.1:4000"
    argv = ["--config", str(path), "--publish-rate=9", "--peer", other]
    args, _ = config_file.parse(build_parser(), argv)
    assert (args.publish_rate, args.call_rate) == (9.0, 7.0)
    assert [p.quic_port for p in args.peer] == [4000]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("port = 0\nmax-recrods = 3\n", "line 2: unknown key 'max-recrods' (did you mean"),
        ("\n\nport = 'x'\n", "line 3: key 'port': 'x' is not a whole number"),
        ("lat = 'north'\n", "line 1: key 'lat': 'north' is not a number"),
        ("no-memory = 'yes'\n", "line 1: key 'no-memory': expected true or false"),
        ("peer = ['nonsense']\n", "line 1: key 'peer': "),
        ("log-level = 'loud'\n", "line 1: key 'log-level': 'loud' is not one of debug"),
        ("publish-rate = true\n", "line 1: key 'publish-rate': expected a value, got bool"),
        ("port = 0\n[house]\nmemory = 1\n", "line 2: [house]: tables are not options"),
    ],
)  # fmt: skip
def test_a_bad_file_names_its_line_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(config_file.ConfigFileError) as caught:
        config_file.parse(build_parser(), ["--config", str(path)])
    said = str(caught.value)
    assert said.startswith(f"{path} line") and message in said
    assert "invalid literal" not in said and "could not convert" not in said  # Python's words


def test_blame_names_the_exact_flag() -> None:
    loaded = config_file.Loaded(Path("s.toml"), lines={"max_records": ("max-records", 4)})
    assert "line 4" in loaded.blame("--max-records must be positive")
    assert loaded.blame("--max-records-per-signer bad") == "--max-records-per-signer bad"


def test_no_config_parses_like_before() -> None:
    args, loaded = config_file.parse(build_parser(), ["--port", "0"])
    assert args.port == 0 and loaded.path is None
    assert vars(args) == vars(build_parser().parse_args(["--port", "0"]))
    assert isinstance(args, argparse.Namespace)
