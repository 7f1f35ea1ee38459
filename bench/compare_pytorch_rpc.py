#!/usr/bin/env python3
"""PyTorch's own RPC (TensorPipe backend) on the payloads of `ferry-bench rpc`, and Ferry's in the
same run.

Run with Debian's python3-torch:
    /usr/bin/python3 bench/compare_pytorch_rpc.py --ferry-bench build/bin/ferry-bench

Two processes on loopback for each of: TensorPipe as PyTorch configures it (`pytorch_default`),
TensorPipe over plain TCP only (`pytorch_tcp`: the uv transport and the basic channel, no shared
memory or cross-memory-attach), and, with --ferry-bench, `ferry-bench rpc`. Prints one JSON object
last: each one's figures, and Ferry's echo bandwidth over PyTorch's TCP-only figure.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
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


CONFIGURATIONS = {
    "pytorch_default": {},
    "pytorch_tcp": {"_transports": ["uv"], "_channels": ["basic"]},
}


def measure(repeats, configuration):
    to = "worker1"
    out = {"implementation": f"torch {torch.__version__} tensorpipe", "configuration": configuration}
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
        print(f"{configuration}: echo {mib} MiB {echo_gbps[f'{mib}MiB']:.2f} GB/s", file=sys.stderr)
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


def run(rank, port, repeats, configuration, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("TP_SOCKET_IFNAME", "lo")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    options = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=4, rpc_timeout=120, **CONFIGURATIONS[configuration]
    )
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2, rpc_backend_options=options)
    if rank == 0:
        queue.put(measure(repeats, configuration))
    rpc.shutdown()


def run_pytorch(repeats, configuration):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=run, args=(r, port, repeats, configuration, queue)) for r in range(2)
    ]
    for p in procs:
        p.start()
    result = queue.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
    return result


def run_ferry(path, repeats):
    done = subprocess.run(
        [path, "rpc", "--echo-repeats", str(repeats)],
        stdout=subprocess.PIPE,
        check=True,
        timeout=600,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11, help="repeats of each bandwidth figure")
    parser.add_argument("--ferry-bench", help="path of ferry-bench, to measure Ferry in the same run")
    parser.add_argument(
        "--configurations",
        nargs="+",
        default=list(CONFIGURATIONS),
        choices=list(CONFIGURATIONS),
        help="PyTorch configurations to measure",
    )
    args = parser.parse_args()
    out = {"benchmark": "rpc-vs-pytorch", "torch": torch.__version__}
    if args.ferry_bench:
        out["ferry"] = run_ferry(args.ferry_bench, args.repeats)
    for configuration in args.configurations:
        out[configuration] = run_pytorch(args.repeats, configuration)
    if "ferry" in out:
        for configuration in args.configurations:
            theirs = out[configuration]["echo_gbps"]
            ours = out["ferry"]["echo_gbps"]
            out[f"ferry_echo_over_{configuration}"] = {
                size: ours[size] / theirs[size] for size in theirs if size in ours
            }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
