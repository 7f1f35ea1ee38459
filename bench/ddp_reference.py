#!/usr/bin/env python3
"""PyTorch's own data parallelism on the model `ferry-bench train --stages 1` trains, for comparison.

    /usr/bin/python3 bench/ddp_reference.py [--procs 2] [--batch 64] [--image-size 64] [--steps 12]

Trains a U-Net with a ResNet-34 encoder (segmentation_models_pytorch's Unet("resnet34") layer for
layer, written out here so that Debian's python3-torch alone runs it) with SGD (momentum 0.9,
weight decay 1e-4) and a BCE loss, in one process on the whole batch, then with
DistributedDataParallel over Gloo in `--procs` processes on equal shares of it. Every process has
one thread and is pinned to a core of its own. Prints one JSON object last: each run's median
images per second over the timed steps, and their ratio (what `ferry-bench train --stages 1
--same-global-batch` reports as throughput_ratio).
"""
import argparse
import json
import os
import socket
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.downsample is None else self.downsample(x)))


def layer(cin, cout, blocks, stride):
    return nn.Sequential(BasicBlock(cin, cout, stride),
                         *[BasicBlock(cout, cout, 1) for _ in range(blocks - 1)])


def conv_bn_relu(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True))


class DecoderBlock(nn.Module):
    def __init__(self, cin, skip, cout):
        super().__init__()
        self.conv1 = conv_bn_relu(cin + skip, cout)
        self.conv2 = conv_bn_relu(cout, cout)

    def forward(self, x, skip=None):
        x = nn.functional.interpolate(x, scale_factor=2, mode="nearest")
        if skip is not None:
            x = torch.cat([x, skip], dim=1)
        return self.conv2(self.conv1(x))


class UnetResNet34(nn.Module):
    def __init__(self, classes=1):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.layers = nn.ModuleList([layer(64, 64, 3, 1), layer(64, 128, 4, 2),
                                     layer(128, 256, 6, 2), layer(256, 512, 3, 2)])
        ins, skips, outs = [512, 256, 128, 64, 32], [256, 128, 64, 64, 0], [256, 128, 64, 32, 16]
        self.decoder = nn.ModuleList([DecoderBlock(i, s, o) for i, s, o in zip(ins, skips, outs)])
        self.head = nn.Conv2d(16, classes, 3, padding=1)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        features = [x]
        x = nn.functional.max_pool2d(x, 3, 2, 1)
        for i, stage in enumerate(self.layers):
            x = stage(x)
            features.append(x)
        skips = features[-2::-1] + [None]
        for block, skip in zip(self.decoder, skips):
            x = block(x, skip)
        return self.head(x)


def train(rank, procs, args, result_dir, init_file):
    # Loopback only: the processes are all here.
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.manual_seed(0)
    model = UnetResNet34()
    if procs > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=procs)
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    share = args.batch // procs
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(share, 3, args.image_size, args.image_size, generator=generator)
    y = (torch.rand(share, 1, args.image_size, args.image_size, generator=generator) > 0.5).float()
    times = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = nn.functional.binary_cross_entropy_with_logits(model(x), y)
        loss.backward()
        optimizer.step()
        if procs > 1:
            dist.barrier()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    if rank == 0:
        with open(os.path.join(result_dir, f"{procs}.json"), "w") as f:
            json.dump(times, f)
    if procs > 1:
        dist.destroy_process_group()


def run(procs, args, result_dir):
    init_file = os.path.join(result_dir, f"init-{procs}")
    # Processes of their own even alone: each pins itself, and this one must stay free to spawn
    # the next run's on every core.
    mp.spawn(train, args=(procs, args, result_dir, init_file), nprocs=procs, join=True)
    with open(os.path.join(result_dir, f"{procs}.json")) as f:
        return args.batch / statistics.median(json.load(f))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64, help="the global batch")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=12, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    one, many = [], []
    with tempfile.TemporaryDirectory() as result_dir:
        for _ in range(args.repeats):
            one.append(run(1, args, result_dir))
            many.append(run(args.procs, args, result_dir))
    out = {"benchmark": "ddp_reference", "model": "unet-resnet34", "image_size": args.image_size,
           "batch": args.batch, "procs": args.procs, "steps": args.steps,
           "images_per_s_1": statistics.median(one), "images_per_s_ddp": statistics.median(many),
           "throughput_ratio": statistics.median(many) / statistics.median(one)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
