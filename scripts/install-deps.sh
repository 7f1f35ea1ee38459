#!/usr/bin/env bash
# Installs every Debian package that Ferry's build, benchmarks and demo need; with --tests, also
# what only tests need (clang-14 with its sanitizer runtimes, for the libFuzzer targets; Python with
# torch and torchvision, for the tests that read files Python wrote and load an export into smp's
# U-Net written out on torchvision's ResNet; Open MPI and Slurm with munge, for the tests that run
# Ferry under those launchers).
# Idempotent: when everything is present it only checks dpkg's database and returns.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache
  libtorch-dev libgloo-dev
  libcapnp-dev capnproto
  libuv1-dev libfmt-dev
  libcli11-dev nlohmann-json3-dev
  libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev libpng-dev
  libgtest-dev googletest
  libsodium-dev
  iproute2 procps
)
if [ "${1:-}" = "--tests" ]; then
  packages+=(clang-14 libclang-rt-14-dev python3-torch python3-torchvision openmpi-bin slurmctld slurmd slurm-client munge)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
