"""The runtime gate's problems: what a bad setting, an unreachable station or a host name that
resolves nowhere become, and what is said at start-up (``tools.server.runtime_gate``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from macula.errors import BrokenError, ConfigError
from macula.stations import parse_station
from tools.server.runtime_gate import problem_of, startup_problem, unresolved


def test_a_bad_setting_is_a_configuration_problem_naming_the_variable() -> None:
    problem = problem_of(ConfigError("MACULA_MESH_STATIONS: 'a:b:c': port must be 1..65535"), [])
    assert (problem.code, problem.retryable) == ("configuration", 0)
    assert problem.facts["variable"] == "MACULA_MESH_STATIONS"
    assert "MACULA_MESH_STATIONS" in problem.next_action
    result = problem.result()
    assert result.is_error and result.structured_content
    assert result.structured_content["code"] == "configuration"


def test_no_station_is_station_unreachable_with_what_was_tried_and_the_fix() -> None:
    problem = problem_of(BrokenError("no station reachable"), ["127.0.0.1:1"])
    assert (problem.code, problem.retryable) == ("station_unreachable", 1)
    assert problem.facts == {"stations": ["127.0.0.1:1"], "tried": "no station reachable"}
    assert "127.0.0.1:1" in problem.next_action and "retries" in problem.next_action


def test_start_up_says_a_bad_setting_and_a_contact_policy_that_means_closed(
    tmp_path: Path,
) -> None:
    said: list[str] = []
    env = {"MACULA_HOME": str(tmp_path), "MACULA_MCP_AGENT": "ada"}
    assert startup_problem(env, said.append) is None and said == []
    problem = startup_problem({**env, "MACULA_MESH_STATIONS": "x:0"}, said.append)
    assert problem is not None and problem.code == "configuration"
    assert said[-1].startswith("ERROR: MACULA_MESH_STATIONS")
    startup_problem({**env, "MACULA_MCP_CONTACT_POLICY": "yes-please"}, said.append)
    assert said[-1].startswith("WARNING: MACULA_MCP_CONTACT_POLICY") and "closed" in said[-1]


@pytest.mark.anyio
async def test_a_station_list_whose_names_resolve_nowhere_is_a_setting_error() -> None:
    found = await unresolved([parse_station("nonsense.invalid:4433")])
    assert isinstance(found, ConfigError) and str(found).startswith("MACULA_MESH_STATIONS")
    assert await unresolved([parse_station("127.0.0.1:1")]) is None
    assert await unresolved([]) is None


@pytest.mark.anyio
async def test_the_gate_answers_the_problem_then_opens_when_a_call_wakes_it() -> None:
    import contextlib
    from collections.abc import AsyncIterator
    from typing import Any

    from tools.server.runtime_gate import Problem, RuntimeGate

    state = {"up": 0, "attempts": 0}
    opened = object()

    @contextlib.asynccontextmanager
    async def opener(attempt: int) -> AsyncIterator[Any]:
        state["attempts"] += 1
        if not state["up"]:
            raise BrokenError("no station reachable")
        yield opened

    async with RuntimeGate(opener, stations=[parse_station("127.0.0.1:1")]) as gate:
        found = await gate.usable()  # waits for the first attempt's outcome
        assert isinstance(found, Problem) and found.code == "station_unreachable"
        assert gate.view()["problem"]["code"] == "station_unreachable"
        state["up"] = 1  # the cause is gone; the keeper waits 1 s before trying again ...
        assert await gate.usable() is opened  # ... but a call wakes it
        assert gate.runtime is opened and "problem" not in gate.view()
    assert state["attempts"] == 2


@pytest.mark.anyio
async def test_a_gate_without_an_opener_only_ever_answers_its_problem() -> None:
    from tools.server.runtime_gate import Problem, RuntimeGate

    problem = Problem("daemon_unavailable", "another version", "stop it", retryable=1)
    async with RuntimeGate(None, problem=problem) as gate:
        assert await gate.usable() is problem
        assert await gate.usable() is problem
