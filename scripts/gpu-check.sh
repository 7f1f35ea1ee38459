#!/usr/bin/env bash
# One command on a machine with a GPU and a CUDA LibTorch: builds what it needs against that
# LibTorch (TORCH_DIR, else the python3 torch's CMake folder), runs the device tests (cuda_test),
# trains `make demo`'s job once with every stage on the CPU and once with every stage on cuda:0,
# and prints, as one JSON object last: images/s of both and their ratio, the last epoch's
# validation IoU of both, each worker process's device-memory peak (nvidia-smi, CUDA's context
# included) and the share of training time each worker spent copying stage tensors between
# device and host (forward and backward, as its stage table's device_copy_s counts them).
#
#   scripts/gpu-check.sh              on the GPU machine
#   scripts/gpu-check.sh --cpu-only   the same steps with no GPU (both runs on the CPU, no
#                                     cuda_test), to check the script itself on any machine
#
# Ferry's other dependencies (Cap'n Proto, libuv, libsodium, fmt, CLI11, nlohmann-json, OpenCV)
# must be installed or named by CMAKE_PREFIX_PATH; the build goes to BUILD_DIR (build-cuda).
# EPOCHS (default 3) trims the job so that a check takes well under 10 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

cpu_only=0
if [ "${1:-}" = "--cpu-only" ]; then cpu_only=1; fi
build_dir=${BUILD_DIR:-build-cuda}
epochs=${EPOCHS:-3}
out=${GPU_CHECK_OUT:-$build_dir/gpu-check}
mkdir -p "$out"
say() { echo "gpu-check: $*" >&2; }

torch_dir=${TORCH_DIR:-}
if [ -z "$torch_dir" ] && [ "$cpu_only" = 0 ]; then
  torch_dir=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null) || {
    say "no TORCH_DIR and no python3 torch: name a CUDA LibTorch with TORCH_DIR=..."
    exit 2
  }
fi
if [ "$cpu_only" = 0 ]; then
  if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
    say "nvidia-smi sees no GPU here (use --cpu-only to check the script without one)"
    exit 2
  fi
fi

prefix=()
if [ -n "$torch_dir" ]; then
  prefix=(-DCMAKE_PREFIX_PATH="$torch_dir${CMAKE_PREFIX_PATH:+;$CMAKE_PREFIX_PATH}")
  # pip's LibTorch brings fmt headers of its own, first on the include path.
  if [ -d "$torch_dir/../../include/fmt" ]; then prefix+=(-DCMAKE_CXX_FLAGS=-DFMT_HEADER_ONLY); fi
fi
targets=(ferry-master ferry-worker ferry-launch)
options=("${prefix[@]}")
if [ "$cpu_only" = 0 ]; then
  targets+=(cuda_test)
  options+=(-DFERRY_CUDA_TESTS=ON -DFERRY_FUZZ=OFF)
fi
start=$(date +%s)
say "configuring $build_dir${torch_dir:+ against $torch_dir}"
cmake -S . -B "$build_dir" -G Ninja "${options[@]}" > "$out/configure.log"
say "building ${targets[*]}"
cmake --build "$build_dir" -j "$(nproc)" --target "${targets[@]}" > "$out/build.log" || {
  tail -40 "$out/build.log" >&2
  exit 1
}
build_s=$(($(date +%s) - start))

cuda_test="not run (--cpu-only)"
if [ "$cpu_only" = 0 ]; then
  if "$build_dir/bin/cuda_test" > "$out/cuda_test.log" 2>&1; then
    cuda_test=$(grep -o '[0-9]* tests\? from [0-9]* test suites\? ran' "$out/cuda_test.log" | tail -1)
    cuda_test="passed: $cuda_test"
  else
    cuda_test="FAILED (see $out/cuda_test.log)"
    tail -30 "$out/cuda_test.log" >&2
  fi
fi

# Every worker process's largest device memory while the job runs, by its RANK.
watch_device_memory() {
  local file=$1
  : > "$file"
  while true; do
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2> /dev/null |
      while IFS=', ' read -r pid mib; do
        rank=$(tr '\0' '\n' < "/proc/$pid/environ" 2> /dev/null | sed -n 's/^RANK=//p')
        echo "${rank:-pid$pid} $mib"
      done >> "$file"
    sleep 0.5
  done
}

train() {
  local device=$1 name=$2
  say "training on $device ($epochs epochs)"
  local watcher=""
  if [ "$cpu_only" = 0 ]; then
    watch_device_memory "$out/$name.device-memory" &
    watcher=$!
  fi
  local status=0
  "$build_dir/bin/ferry-launch" --nproc 4 -- "$build_dir/bin/ferry-master" train \
    --model unet-resnet34 --data synthetic --image-size 64 --samples 384 --epochs "$epochs" \
    --batch-size 8 --optimizer adam --lr 0.003 --device "$device" \
    --metrics-file "$out/$name.json" > "$out/$name.log" 2>&1 || status=$?
  if [ -n "$watcher" ]; then kill "$watcher" 2> /dev/null || true; fi
  if [ "$status" != 0 ]; then
    tail -30 "$out/$name.log" >&2
    say "training on $device failed ($status)"
    exit 1
  fi
}

train cpu cpu
gpu_device=cuda:0
if [ "$cpu_only" = 1 ]; then gpu_device=cpu; fi
train "$gpu_device" gpu

python3 - "$out" "$gpu_device" "$build_s" "$cuda_test" "$cpu_only" << 'EOF'
import json, os, sys
out, device, build_s, cuda_test, cpu_only = sys.argv[1:]
def run(name):
    with open(os.path.join(out, name + ".json")) as f:
        m = json.load(f)
    last = m["epochs"][-1]
    # The first epoch warms up (kernels chosen, allocator grown): the speed is the later epochs'.
    later = m["epochs"][1:] or m["epochs"]
    speeds = sorted(e["images_per_s"] for e in later)
    train_s = sum(e["train_s"] for e in m["epochs"])
    stages = [{"stage": s["name"], "worker": s["worker"], "device": s.get("device", "?"),
               "copy_share": round(s.get("worker_device_copy_s", 0) / train_s, 4) if train_s else 0,
               "tensor_peak_mib": round(s["worker_peak_tensor_mib"], 1)} for s in m["stages"]]
    return {"images_per_s": round(speeds[len(speeds) // 2], 2), "val_iou": round(last["val_iou"], 4),
            "train_s": round(train_s, 2), "stages": stages}
def peaks(name):
    path = os.path.join(out, name + ".device-memory")
    best = {}
    if os.path.exists(path):
        for line in open(path):
            who, mib = line.split()
            best[who] = max(best.get(who, 0), int(mib))
    return {("rank " + k if k.isdigit() else k): v for k, v in sorted(best.items())}
cpu, gpu = run("cpu"), run("gpu")
report = {"device": device, "cpu_only_check": cpu_only == "1", "build_s": int(build_s),
          "cuda_test": cuda_test, "epochs": len(json.load(open(os.path.join(out, "gpu.json")))["epochs"]),
          "cpu": cpu, "gpu": gpu,
          "speedup": round(gpu["images_per_s"] / cpu["images_per_s"], 2) if cpu["images_per_s"] else None,
          "device_memory_peak_mib": peaks("gpu")}
print(json.dumps(report))
EOF
