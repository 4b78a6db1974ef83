"""The owner's approval queue in a real headless Chromium (Debian's ``chromium``, playwright),
against a real daemon (``macula-mcp console`` starts it) hosting an agent attached through
``macula-mcp attach`` (the official SDK client), and a stranger (a real agent over a real
station) handing it tasks:
- the stranger's task waits; its sender sees ``pending_owner_approval``; the owner approves it
  in the page (one click, the content shown) and the task reaches the agent's
  ``mesh_task_wait``; the model's ``mesh_approvals`` showed metadata only;
- a second task waits; the daemon is SIGKILLed and started again: the item is still in the
  page; the owner denies it; once the agent is back, the sender's copy ends ``failed``
  (``refused: owner denied``).
Skipped, saying why, when /usr/bin/chromium is absent."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from macula.agent.agent import Agent
from macula.agent.task_messages import TaskLimits
from macula.node.node import Node
from relay.station.station import Station
from support.consolekit import CHROMIUM
from support.identities import new_identity
from support.mcpkit import cli, good, server_params, stop_daemon_for_good
from support.meshkit import settings
from support.waiting import eventually
from tools.daemon.unix_socket import read_pid
from tools.launch import server_command
from tools.settings import socket_path

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} absent (apt chromium)"),
]

SECRET = "rotate the signing keys in vault/prod"


@pytest.fixture
def home() -> Iterator[Path]:
    """A short MACULA_HOME (its socket must fit AF_UNIX); its daemon stopped, or killed, after."""
    folder = Path(tempfile.mkdtemp(prefix="mca-", dir="/tmp"))
    (folder / "owner.toml").write_text("[approvals]\ntasks_from_strangers = 1\n")
    yield folder
    stop_daemon_for_good(folder)
    shutil.rmtree(folder, ignore_errors=True)


@contextlib.asynccontextmanager
async def stranger(station: Station, home: Path) -> AsyncIterator[Agent]:
    config = dataclasses.replace(
        settings(home, "open"), task_limits=TaskLimits(retry_initial_ms=50, retry_max_ms=300)
    )
    async with Node(new_identity(), [station.endpoint]) as node, Agent(node, config) as agent:
        await agent.hello()
        yield agent


async def console_url(env: dict[str, str]) -> str:
    done = await asyncio.to_thread(cli, ["console"], env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


async def approvals_page(browser: Any, url: str) -> Any:
    page = await browser.new_page()
    await page.goto(url)
    await page.click('#tabs button[data-tab="approvals"]')
    return page


async def test_the_owner_decides_in_the_console_and_the_queue_survives_a_daemon_kill(
    home: Path, station: Station, tmp_path: Path, browser: Any
) -> None:
    env = dict(os.environ, MACULA_HOME=str(home), MACULA_MESH_STATIONS=station.endpoint)
    agent_env = dict(env, MACULA_MCP_AGENT="ada", MACULA_MCP_CONTACT_POLICY="ask")
    url = await console_url(env)
    async with stranger(station, tmp_path / "stranger") as sender:
        async with Client(server_params(agent_env, [*server_command(), "attach"])) as ada:
            me = await good(ada, "mesh_hello")
            ada_id = bytes.fromhex(me["node_id"])
            sent = await sender.tasks.send(ada_id, "keys", SECRET)
            assert sent.state == "pending_owner_approval", sent  # the sender knows at once
            shown = await good(ada, "mesh_approvals")
            assert [i["kind"] for i in shown["pending"]] == ["task"]
            assert SECRET not in str(shown) and "content" not in shown["pending"][0]
            assert (await good(ada, "mesh_task_list"))["tasks"] == []

            page = await approvals_page(browser, url)
            item = f'#approval-list li[data-approval="{shown["pending"][0]["approval_id"]}"]'
            await page.wait_for_selector(item, timeout=15_000)
            assert SECRET in (await page.text_content(f"{item} .approval-content") or "")
            await page.click(f"{item} button.approve")

            handed = await good(ada, "mesh_task_wait", wait_seconds=20)
            assert handed["task"]["task_id"] == sent.task_id, handed
            assert handed["task"]["state"] == "submitted"
            got = await good(ada, "mesh_task_get", task_id=sent.task_id)
            assert got["input"] == SECRET  # approved: the model reads it as any task's input
            await eventually(lambda: _state(sender, sent.task_id, "submitted"), 10)
            await page.wait_for_selector(item, state="detached")

            second = await sender.tasks.send(ada_id, "more keys", "and /etc")
            assert second.state == "pending_owner_approval"
            [waiting] = (await good(ada, "mesh_approvals"))["pending"]
            await page.close()

        # the daemon dies hard and comes back: the item is still there, read from its store
        pid = read_pid(socket_path(env))
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await eventually(lambda: _gone(pid), 10)
        url = await console_url(env)
        assert read_pid(socket_path(env)) != pid
        page = await approvals_page(browser, url)
        item = f'#approval-list li[data-approval="{waiting["approval_id"]}"]'
        await page.wait_for_selector(item, timeout=15_000)
        await page.click(f"{item} button.deny")
        await page.wait_for_selector(item, state="detached")

        async with Client(server_params(agent_env, [*server_command(), "attach"])) as ada:
            await good(ada, "mesh_hello")  # the agent is back: the decision reaches the sender
            ended = await sender.tasks.wait(second.task_id, 20, after_state_seq=2)
            assert ended.task is not None and ended.task.state == "failed", ended
            assert (ended.task.error or "").startswith("refused: owner denied")
            assert (await good(ada, "mesh_approvals"))["pending"] == []
            listed = (await good(ada, "mesh_task_list"))["tasks"]
            assert [t["task_id"] for t in listed] == [sent.task_id]  # the denied one never came


async def _state(sender: Agent, task_id: str, expected: str) -> bool:
    return (await sender.tasks.get(task_id)).state == expected


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
