"""The owner's allowlist of A2A agents (``[a2a]`` of owner.toml): read, normalised, and refused
whole (fail closed, naming the file and key) when anything in it is wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools.a2a.allowlist import (
    MAX_AGENTS,
    AllowlistError,
    load,
    looks_like_a2a,
    normalise,
    origin_of,
)


def write(home: Path, text: str, mode: int = 0o600) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    path = home / "owner.toml"
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_no_file_no_table_no_agents_allow_nothing(tmp_path: Path) -> None:
    assert load(tmp_path / "none").agents == ()
    write(tmp_path, "[switches]\nmesh_serve = 0\n")
    assert load(tmp_path).agents == ()
    write(tmp_path, "[a2a]\n")
    assert load(tmp_path).find("http://127.0.0.1:9999/") is None


def test_entries_are_found_by_url_normalised_or_by_name(tmp_path: Path) -> None:
    write(
        tmp_path,
        '[a2a]\nagents = ["HTTP://LocalHost:9999", '
        '{ url = "https://a.example/x/.well-known/agent-card.json", name = "reviewer" }]\n',
    )
    allowlist = load(tmp_path)
    first, second = allowlist.agents
    assert first.url == "http://localhost:9999/"
    assert first.card_url == "http://localhost:9999/.well-known/agent-card.json"
    assert second.card_url == second.url and second.name == "reviewer"
    assert allowlist.find("http://localhost:9999") is first
    assert allowlist.find("a2a:reviewer") is second
    assert allowlist.find("http://localhost:9998/") is None
    assert allowlist.find("a2a:other") is None
    assert second.origin == "https://a.example:443"


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("[a2a\n", "not valid TOML"),
        ("a2a = 1\n", "a2a: expected a table"),
        ('[a2a]\nagents = "http://x/"\n', "a2a.agents: expected a list"),
        ("[a2a]\nurls = []\n", "a2a.urls: unknown key"),
        ('[a2a]\nagents = ["ftp://x/"]\n', "a2a.agents[0]: http:// or https:// only"),
        ('[a2a]\nagents = ["http://u:p@x/"]\n', "a2a.agents[0]: no user or password"),
        ('[a2a]\nagents = ["http://x/?q=1"]\n', "a2a.agents[0]: no query"),
        ('[a2a]\nagents = ["http:///nohost"]\n', "a2a.agents[0]: no host"),
        (
            '[a2a]\nagents = ["http://x/", "http://X/"]\n',
            "a2a.agents[1]: http://x/ is listed twice",
        ),
        ('[a2a]\nagents = [{ url = "http://x/", name = "Bad Name" }]\n', "a2a.agents[0].name"),
        ('[a2a]\nagents = [{ url = "http://x/", token = "s" }]\n', "a2a.agents[0].token"),
        ('[a2a]\nagents = [{ name = "n" }]\n', "a2a.agents[0].url: expected a URL"),
        ("[a2a]\nagents = [3]\n", "a2a.agents[0]: expected a URL"),
    ],
)
def test_a_malformed_table_refuses_everything_naming_file_and_key(
    tmp_path: Path, text: str, names: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(AllowlistError) as caught:
        load(tmp_path)
    assert str(path) in str(caught.value) and names in str(caught.value)


def test_too_many_agents_and_a_file_others_may_write_are_refused(tmp_path: Path) -> None:
    urls = ", ".join(f'"http://h{i}/"' for i in range(MAX_AGENTS + 1))
    write(tmp_path, f"[a2a]\nagents = [{urls}]\n")
    with pytest.raises(AllowlistError, match="at most"):
        load(tmp_path)
    write(tmp_path, '[a2a]\nagents = ["http://x/"]\n', mode=0o620)
    with pytest.raises(AllowlistError, match="chmod 600"):
        load(tmp_path)


def test_what_counts_as_an_a2a_recipient() -> None:
    assert looks_like_a2a("http://127.0.0.1:1/") and looks_like_a2a(" HTTPS://x")
    assert looks_like_a2a("a2a:reviewer")
    assert not looks_like_a2a("brave_blue_fox_0042") and not looks_like_a2a("ab" * 32)


def test_normalise_and_origin() -> None:
    assert normalise("http://[::1]:80") == "http://[::1]:80/"
    assert origin_of("http://x/") == "http://x:80" and origin_of("https://x:8443/a") == (
        "https://x:8443"
    )
    for bad in ("", "http://x/ y", "http://x:99999/", "x" * 600):
        with pytest.raises(ValueError):
            normalise(bad)
