"""Server CPU per infer request of two edged code trees, measured side by side over Unix sockets.

Each tree's HttpServer runs as its own process (``bench_uds.py --serve-edged`` with that tree on PYTHONPATH);
one client alternates keep-alive requests between them (tiny_mlp, batch 1, binary data, concurrency 1), so
the drift of a shared machine's load hits both alike. The figure is each server's user + system CPU from
/proc divided by the requests it answered, and its two parts: the system part is mostly the same three
syscalls per request in both trees (read, write, epoll_wait, and the wake-ups of the client they cause), so
it bounds what any change to edged's Python can gain. Run it twice with the trees swapped.

    .venv/bin/python scripts/bench_uds_pair.py BASE_TREE NEW_TREE [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_uds import _request_body, _UnixConnection

SCRIPT = Path(__file__).resolve().parent / "bench_uds.py"


def _cpu_parts(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs=2, type=Path)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=len(os.sched_getaffinity(0)) > 1,
                        help="the client on the first core, both servers on the last (default with 2+ cores)")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp()
    servers = []
    for index, tree in enumerate(args.trees):
        path = os.path.join(workdir, f"{index}.sock")
        proc = subprocess.Popen([sys.executable, str(SCRIPT), "--serve-edged", path], cwd=tree, text=True,
                                env={**os.environ, "PYTHONPATH": str(tree.resolve())}, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"the server of {tree} did not start")
        servers.append((proc, _UnixConnection(path)))
    if args.pin:
        # Left to the scheduler, one server tends to share the client's core (a cheaper wake-up) and the other
        # not: the first of the two trees came out 10 % cheaper than the second, whichever tree it was.
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[0]})
        for proc, _ in servers:
            os.sched_setaffinity(proc.pid, {cores[-1]})
    body, header_length = _request_body()
    headers = {"Inference-Header-Content-Length": str(header_length), "Content-Type": "application/octet-stream"}

    def one(conn: _UnixConnection) -> None:
        conn.request("POST", "/v2/models/tiny_mlp/infer", body, headers)
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"HTTP {response.status}")

    try:
        for _ in range(300):  # warm both up the same way
            for _, conn in servers:
                one(conn)
        before = [_cpu_parts(proc.pid) for proc, _ in servers]
        count = 0
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            for _, conn in servers:
                one(conn)
            count += 1
        after = [_cpu_parts(proc.pid) for proc, _ in servers]
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait()
    parts = [((a[0] - b[0]) * 1e6 / count, (a[1] - b[1]) * 1e6 / count) for a, b in zip(after, before, strict=True)]
    cpu = [user + system for user, system in parts]
    for tree, (user, system) in zip(args.trees, parts, strict=True):
        print(f"{tree}: {user + system:6.1f} us server CPU per request over {count} requests "
              f"(user {user:.1f}, system {system:.1f})")
    print(f"second / first: {cpu[1] / cpu[0]:.3f} (user {parts[1][0] / parts[0][0]:.3f}, "
          f"system {parts[1][1] / parts[0][1]:.3f})")


if __name__ == "__main__":
    main()
