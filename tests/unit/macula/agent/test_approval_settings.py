"""The owner's [approvals] settings: defaults, per-agent overrides, and failing closed."""

from __future__ import annotations

from pathlib import Path

from macula.agent.approvals import DEFAULT_MAX_PENDING, DEFAULT_TTL_S, load_settings


def test_missing_file_or_table_means_nothing_is_held(tmp_path: Path) -> None:
    assert load_settings(tmp_path / "owner.toml", None).tasks_from_strangers == 0
    (tmp_path / "owner.toml").write_text("[tools]\nrooms = 1\n")
    settings = load_settings(tmp_path / "owner.toml", None)
    held = (settings.tasks_from_strangers, settings.rings_when_asked, settings.error)
    assert held == (0, 0, None)
    assert (settings.ttl_s, settings.max_pending) == (DEFAULT_TTL_S, DEFAULT_MAX_PENDING)


def test_values_and_an_agents_override(tmp_path: Path) -> None:
    path = tmp_path / "owner.toml"
    path.write_text(
        "[approvals]\ntasks_from_strangers = 1\nttl_s = 600\nmax_pending = 5\n"
        "[agents.bob.approvals]\ntasks_from_strangers = 0\nrings_when_asked = true\n"
    )
    home = load_settings(path, "alice")
    assert (home.tasks_from_strangers, home.rings_when_asked, home.ttl_s) == (1, 0, 600)
    bob = load_settings(path, "bob")
    assert (bob.tasks_from_strangers, bob.rings_when_asked, bob.max_pending) == (0, 1, 5)


def test_a_bad_key_fails_closed_and_names_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "owner.toml"
    path.write_text("[approvals]\ntasks_from_strangers = 2\nttl_s = 600\n")
    settings = load_settings(path, None)
    assert (settings.tasks_from_strangers, settings.rings_when_asked) == (1, 1)
    assert settings.ttl_s == 600  # a valid number is kept
    assert settings.error is not None
    assert str(path) in settings.error and "[approvals] tasks_from_strangers" in settings.error


def test_unknown_key_bad_table_and_bad_toml_fail_closed(tmp_path: Path) -> None:
    path = tmp_path / "owner.toml"
    for text, named in (
        ("[approvals]\nfrom_strangers = 0\n", "from_strangers: unknown key"),
        ("approvals = 3\n", "[approvals]: expected a table"),
        ("[agents.bob.approvals]\nmax_pending = 0\n", "[agents.bob.approvals] max_pending"),
        ("[approvals\n", "cannot be read as TOML"),
    ):
        path.write_text(text)
        settings = load_settings(path, "bob")
        assert settings.tasks_from_strangers == 1 and settings.rings_when_asked == 1, text
        assert settings.error is not None and named in settings.error, (text, settings.error)
