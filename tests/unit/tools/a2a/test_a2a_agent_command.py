"""``macula-mcp a2a-agent``: the owner edits ``[a2a]`` of owner.toml; the rest of the file stays
as it was, the file stays 0600, and what it cannot edit safely it refuses."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path

import pytest

from tools.a2a.agent_command import main
from tools.a2a.allowlist import load


def run(monkeypatch: pytest.MonkeyPatch, home: Path, *argv: str) -> None:
    monkeypatch.setenv("MACULA_HOME", str(home))
    main(list(argv))


def test_add_list_remove_keep_the_rest_of_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "owner.toml"
    path.write_text("# mine\n[a2a]\nagents = []\n\n[switches]\nmesh_serve = 0 # off\n")
    os.chmod(path, 0o600)
    run(monkeypatch, tmp_path, "add", "HTTP://127.0.0.1:9999", "--name", "helper")
    run(monkeypatch, tmp_path, "add", "https://x.example/a/card.json")
    assert [a.url for a in load(tmp_path).agents] == [
        "http://127.0.0.1:9999/",
        "https://x.example/a/card.json",
    ]
    assert load(tmp_path).find("a2a:helper") is not None
    assert path.read_text().startswith("# mine\n[a2a]\n")
    assert path.read_text().endswith("[switches]\nmesh_serve = 0 # off\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    capsys.readouterr()
    run(monkeypatch, tmp_path, "list")
    assert "a2a:helper" in capsys.readouterr().out
    run(monkeypatch, tmp_path, "remove", "a2a:helper")
    assert [a.name for a in load(tmp_path).agents] == [None]
    assert tomllib.loads(path.read_text())["switches"] == {"mesh_serve": 0}


def test_a_new_home_gets_a_private_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "new"
    run(monkeypatch, home, "add", "http://127.0.0.1:1/")
    assert stat.S_IMODE((home / "owner.toml").stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


@pytest.mark.parametrize(
    ("text", "argv", "says"),
    [
        ("[a2a]\nagents = 1\n", ("add", "http://x/"), 2),
        ('a2a.agents = ["http://x/"]\n', ("add", "http://y/"), 2),
        ("", ("add", "ftp://x/"), "http:// or https:// only"),
        ('[a2a]\nagents = ["http://x/"]\n', ("add", "http://X"), "already allowed"),
        ("", ("remove", "http://x/"), "is not allowed"),
        ("", ("add", "http://x/", "--name", "No Way"), "--name"),
    ],
)
def test_what_it_cannot_do_safely_it_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, argv: tuple[str, ...], says: object
) -> None:
    path = tmp_path / "owner.toml"
    path.write_text(text)
    os.chmod(path, 0o600)
    with pytest.raises(SystemExit) as exited:
        run(monkeypatch, tmp_path, *argv)
    if isinstance(says, int):
        assert exited.value.code == says
    else:
        assert isinstance(says, str) and says in str(exited.value.code)
    assert path.read_text() == text


def test_an_allowlist_edit_and_a_switch_edit_at_once_keep_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``a2a-agent add`` and ``owner set`` editing owner.toml at the same moment: both changes
    are in the file afterwards (they share the owner file's lock)."""
    import threading

    from tools.owner.presets import ALL_TOOLS
    from tools.owner.store import load as load_switches
    from tools.owner.store import policy_path, set_switch

    home = tmp_path / "home"
    monkeypatch.setenv("MACULA_HOME", str(home))
    monkeypatch.setenv("MACULA_MCP_NO_AUDIT", "1")
    urls = [f"http://127.0.0.1:{9000 + n}/" for n in range(20)]
    names = sorted(ALL_TOOLS)[:20]

    def add_all() -> None:
        for url in urls:
            main(["add", url])

    def switch_all() -> None:
        for name in names:
            set_switch(policy_path(home), name, 0)

    threads = [threading.Thread(target=add_all), threading.Thread(target=switch_all)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [a.url for a in load(home).agents] == urls
    switches = load_switches(policy_path(home)).switches(None)
    assert all(switches.on[name] == 0 for name in names)
