"""``scripts/bench_attach.py``'s first-byte clock and percentile on a stand-in server (a real
subprocess that answers one line); no timed assertion."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from support.paths import SCRIPTS

sys.path.insert(0, str(SCRIPTS))

import bench_attach

ECHO_ID = (
    "import json, sys\n"
    "request = json.loads(sys.stdin.readline())\n"
    "print(json.dumps({'jsonrpc': '2.0', 'id': request['id'], 'result': {}}), flush=True)\n"
    "sys.stdin.read()\n"
)


def test_p95_is_the_sample_below_which_95_percent_fall() -> None:
    assert bench_attach.p95([float(n) for n in range(1, 21)]) == 19.0
    assert bench_attach.p95([3.0]) == 3.0


def test_first_byte_reads_the_answer_to_each_opening_request(tmp_path: Path) -> None:
    for method in bench_attach.OPENING:
        took = bench_attach.first_byte([sys.executable, "-c", ECHO_ID], {}, method)
        assert took > 0
    assert json.dumps(bench_attach.OPENING["server/discover"]).count("2026-07-28") == 1
