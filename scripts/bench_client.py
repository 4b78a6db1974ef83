"""Client-side figures only: RPC latency and calls/s (1 and 50 in flight), publish→deliver latency.

Run: ``uv run python scripts/bench_client.py [--quick] [--station NODE_ID@HOST:PORT]``. A thin
wrapper over ``bench_station.py --only client``; every option of that script applies.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_station

if __name__ == "__main__":
    bench_station.main(["--only", "client", *sys.argv[1:]])
