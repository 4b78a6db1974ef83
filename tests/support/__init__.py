"""Every helper the tests share, written once: ``from support.meshkit import station_config``.

``tests/`` is on ``sys.path`` (pyproject ``[tool.pytest.ini_options] pythonpath``), so a test
imports these the same way from any folder under ``tests/``; a test module never imports from
its own folder or from another test module. Helpers import each other relatively, so a script
may import them as ``tests.support.<module>`` too. ``tests/unit/test_tests_shape.py`` fails when
a helper is defined again in a test module.

- ``paths``: the repository's folders (``REPO``, ``SCRIPTS``, ``VECTORS``).
- ``waiting``: ``eventually`` (a polled condition with a deadline), ``entered``; ``running``:
  ``run`` (a coroutine run from a synchronous test).
- ``vectorkit``, ``cbor_reference``: the committed vectors; the pre-optimisation CBOR codec.
- ``stationmesh``: routers and client cores linked in memory (sans-I/O), ``hardened`` identities.
- ``meshkit``, ``rawclient``, ``realmkit``, ``monitorkit``, ``consolekit``, ``workerkit``:
  in-process stations over real QUIC, raw frames, realms, the status and console pages, workers.
- ``processkit``, ``mcpkit``, ``httpkit``: real station and ``macula-mcp`` processes, HTTP MCP.
- ``housekit``, ``storekit``, ``registerkit``: house services, store threads, harness configs.
"""
