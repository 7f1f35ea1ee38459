#!/usr/bin/env bash
# Open MPI's launcher, run for real: `mpirun -np 4 ferry-master train ...` on this host forms the
# world from Open MPI's variables alone (rank, size, the job id for the port; every rank local,
# so the master on loopback) and must exit 0. Usage: open_mpi.sh FERRY_MASTER. Exits 77 (ctest:
# skipped) where Open MPI is not installed, except under CI, where it must run.
set -euo pipefail
master=$1
if ! command -v mpirun > /dev/null; then
  echo "mpirun is not installed (Debian: openmpi-bin)"
  [ -n "${CI:-}" ] && exit 1
  exit 77
fi
work=$(mktemp -d /tmp/ferry-mpi-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
# Open MPI's own daemons talk over loopback only; Ferry's ranks listen there too.
status=0
timeout 200 mpirun --allow-run-as-root --oversubscribe --mca oob_tcp_if_include lo \
  --mca btl self -x FERRY_IFNAME=lo -x GOMP_SPINCOUNT=10000 -np 4 \
  "$master" train --model unet-resnet18 --image-size 32 --samples 48 --batch-size 8 --epochs 1 \
  --metrics-file "$work/metrics.json" 2>&1 | tee "$work/out.log" || status=$?
[ "$status" -eq 0 ] || { echo "mpirun failed: $status"; exit 1; }
grep -q "epoch 1/1: train loss" "$work/out.log" || { echo "no epoch in the output"; exit 1; }
grep -q '"epoch": 1' "$work/metrics.json" || { echo "no metrics"; exit 1; }
echo "mpirun -np 4 trained and exited 0"
