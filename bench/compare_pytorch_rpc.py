#!/usr/bin/env python3
"""PyTorch's own RPC (TensorPipe backend) on the payloads of `ferry-bench rpc`.

Run with Debian's python3-torch:  /usr/bin/python3 bench/compare_pytorch_rpc.py
Two processes on loopback; prints one JSON object last, with the same keys as ferry-bench rpc.
"""
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp


def echo(x):
    return x


def add(a, b):
    return a + b


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p * (len(values) - 1) + 0.5))]


def measure(repeats):
    to = "worker1"
    out = {"benchmark": "rpc", "implementation": f"torch {torch.__version__} tensorpipe"}
    small = torch.randn(10)
    for _ in range(200):
        rpc.rpc_sync(to, add, args=(small, small))
    rtt = []
    for _ in range(2000):
        start = time.perf_counter()
        rpc.rpc_sync(to, add, args=(small, small))
        rtt.append(1e6 * (time.perf_counter() - start))
    out["rtt_us_p50"] = percentile(rtt, 0.5)
    out["rtt_us_p99"] = percentile(rtt, 0.99)

    echo_gbps = {}
    for mib in (1, 16, 64):
        nbytes = mib << 20
        t = torch.randn(nbytes // 4)
        rpc.rpc_sync(to, echo, args=(t,))
        rates = []
        for _ in range(max(repeats, 20 if mib == 1 else repeats)):
            start = time.perf_counter()
            rpc.rpc_sync(to, echo, args=(t,))
            rates.append(2.0 * nbytes / 1e9 / (time.perf_counter() - start))
        echo_gbps[f"{mib}MiB"] = statistics.median(rates)
        print(f"echo {mib} MiB: torch rpc {echo_gbps[f'{mib}MiB']:.2f} GB/s", file=sys.stderr)
    out["echo_gbps"] = echo_gbps

    calls, window = 20000, 500
    rates = []
    for _ in range(max(1, repeats // 2)):
        start = time.perf_counter()
        in_flight = []
        for i in range(calls):
            if len(in_flight) >= window:
                in_flight.pop(0).wait()
            in_flight.append(rpc.rpc_async(to, echo, args=(i,)))
        for f in in_flight:
            f.wait()
        rates.append(calls / (time.perf_counter() - start))
    out["async_calls_per_s"] = statistics.median(rates)
    out["async_window"] = window
    return out


def run(rank, port, repeats, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("TP_SOCKET_IFNAME", "lo")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=4, rpc_timeout=120)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2, rpc_backend_options=options)
    if rank == 0:
        queue.put(measure(repeats))
    rpc.shutdown()


def main():
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    torch.set_num_threads(1)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=run, args=(r, port, repeats, queue)) for r in range(2)]
    for p in procs:
        p.start()
    result = queue.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
