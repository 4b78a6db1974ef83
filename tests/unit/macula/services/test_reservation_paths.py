"""Reserved paths and globs (macula.services.reservation_paths): normalisation, hostile input,
matching a staged path, overlap of two globs, the project id of an origin URL (issue 40)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from macula.services.limits import MAX_RESERVATION_PATH_CHARS
from macula.services.reservation_paths import (
    PathRefused,
    matches,
    normalise_origin,
    normalise_path,
    normalise_project,
    overlaps,
    relative_to_root,
)


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("src/auth/login.py", "src/auth/login.py"),
        ("./src//auth/./x.py", "src/auth/x.py"),
        ("src\\auth\\x.py", "src/auth/x.py"),
        ("src/auth/", "src/auth/**"),
        ("  docs/*.md ", "docs/*.md"),
        ("**", "**"),
    ],
)
def test_paths_are_normalised(raw: str, normal: str) -> None:
    assert normalise_path(raw) == normal


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "   ",
        ".",
        "../secrets",
        "src/../../etc/passwd",
        "/etc/passwd",
        "C:/Windows/x",
        "a/**b/c",
        "a/[ab].py",
        "a/{x,y}.py",
        "a\x00b",
        "a\nb",
        "a\ue000b",
        "*/*/*/*/*/*/*/*/*",
        "**/a/**/b/**/c",
        "x" * (MAX_RESERVATION_PATH_CHARS + 1),
    ],
)
def test_hostile_paths_are_refused(raw: str) -> None:
    with pytest.raises(PathRefused):
        normalise_path(raw)


def test_absolute_paths_inside_the_root_become_relative() -> None:
    assert relative_to_root("/repo/src/a.py", "/repo") == "src/a.py"
    assert relative_to_root("src/a.py", "/repo") == "src/a.py"
    assert relative_to_root("/repo/", "/repo") == "**"
    with pytest.raises(PathRefused):
        relative_to_root("/repository/x", "/repo")
    with pytest.raises(PathRefused):
        relative_to_root("/etc/passwd", "/repo")


@pytest.mark.parametrize(
    ("glob", "path", "covered"),
    [
        ("src/auth/**", "src/auth/login.py", 1),
        ("src/auth/**", "src/auth/deep/er/x.py", 1),
        ("src/auth/**", "src/authz/x.py", 0),
        ("src/auth/**", "src/other.py", 0),
        ("src/*.py", "src/a.py", 1),
        ("src/*.py", "src/a/b.py", 0),
        ("**/*.py", "a/b/c.py", 1),
        ("**/*.py", "c.py", 1),
        ("src/?.py", "src/a.py", 1),
        ("src/?.py", "src/ab.py", 0),
        ("README.md", "README.md", 1),
        ("README.md", "docs/README.md", 0),
        ("a/*", "a/*", 1),
    ],
)
def test_a_glob_covers_the_paths_it_names(glob: str, path: str, covered: int) -> None:
    assert matches(glob, path) == covered


@pytest.mark.parametrize(
    ("a", "b", "meet"),
    [
        ("src/auth/**", "src/auth/login.py", 1),
        ("src/auth/**", "src/**", 1),
        ("src/*.py", "src/a*", 1),
        ("src/*.py", "src/*.js", 0),
        ("**/x.py", "a/**", 1),
        ("a/?b", "a/c?", 1),
        ("a/?b", "a/cc", 0),
        ("a/*/c", "a/b/*", 1),
        ("a/*/c", "a/b/d/c", 0),
        ("docs/**", "src/**", 0),
        ("**", "anything/at/all", 1),
    ],
)
def test_overlap_is_exact(a: str, b: str, meet: int) -> None:
    assert overlaps(a, b) == meet
    assert overlaps(b, a) == meet


WORDS = ["a", "b", "ab", "*", "?", "a*", "*b", "**"]
PATHS = ["a", "b", "ab", "aa", "ba", "abb"]


@given(st.lists(st.sampled_from(WORDS), min_size=1, max_size=3))
def test_a_glob_overlaps_every_path_it_covers(segments: list[str]) -> None:
    glob = "/".join(segments)
    try:
        glob = normalise_path(glob)
    except PathRefused:
        return
    for length in (1, 2, 3):
        for parts in itertools.product(PATHS, repeat=length):
            path = "/".join(parts)
            assert overlaps(glob, path) == matches(glob, path)


def test_hostile_globs_stay_cheap() -> None:
    """The longest, most starred globs allowed are compared in bounded work."""
    a = normalise_path("**/" + "*a" * 6 + "/" + "x" * 400 + "/**")
    b = normalise_path("**/" + "a*" * 6 + "/" + "y" * 400 + "/**")
    assert overlaps(a, b) == 1  # both ** reach any depth


@pytest.mark.parametrize(
    "url",
    [
        "git@github.com:Org/Repo.git",
        "https://github.com/Org/Repo",
        "https://user:token@GitHub.com/Org/Repo.git/",
        "ssh://git@GITHUB.COM:22/Org/Repo.git",
        "git://github.com/Org/Repo.git",
    ],
)
def test_one_repository_has_one_project_id(url: str) -> None:
    assert normalise_origin(url) == "github.com/Org/Repo"


def test_local_origins_and_bad_projects() -> None:
    assert normalise_origin("/srv/git/repo.git") == "srv/git/repo"
    assert normalise_origin("file:///srv/git/repo.git") == "srv/git/repo"
    for bad in ("", "  ", "x" * 300, "a\x00b"):
        with pytest.raises(PathRefused):
            normalise_project(bad)
    with pytest.raises(PathRefused):
        normalise_origin("")
