#!/usr/bin/env bash
# Ferry as another project uses it: installed into a temporary prefix, examples/custom_stage
# built against that prefix with find_package(Ferry), and its custom-master training a network of
# its own stage type on three workers, twice: with its own worker binary, and with stock
# ferry-workers loading the stage as a plugin. Usage: custom_stage.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
source=$2
work=$(mktemp -d /tmp/ferry-install-test.XXXXXX)
trap 'rm -rf "$work"' EXIT

step() { echo "== $*"; }

step "install into $work/prefix"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
for f in bin/ferry-worker bin/ferry-master bin/ferry-launch include/ferry/rpc/rpc.h \
         include/ferry/remote_module/stage_plugin.h include/ferry/trainer/worker_loop.h \
         lib/cmake/Ferry/FerryConfig.cmake \
         lib/cmake/Ferry/FerryConfigVersion.cmake; do
  [ -e "$work/prefix/$f" ] || { echo "not installed: $f"; exit 1; }
done

step "configure and build examples/custom_stage against it"
cmake -S "$source/examples/custom_stage" -B "$work/build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" -j 2

bin=$work/prefix/bin
for form in worker plugin; do
  if [ "$form" = worker ]; then
    others="exec $work/build/custom-worker"
  else
    others="exec $bin/ferry-worker --plugin $work/build/libcustom_stages.so"
  fi
  step "custom-master on three workers ($form)"
  # Every rank runs the same command under the launcher: rank 0 is the master.
  timeout 240 "$bin/ferry-launch" --nproc 4 -- sh -c \
    "if [ \"\$RANK\" = 0 ]; then exec $work/build/custom-master; else $others; fi" \
    2>&1 | tee "$work/$form.log"
  grep -q "stage 2 on worker3" "$work/$form.log" || { echo "no stage on worker3 ($form)"; exit 1; }
  grep -q "loss .* after 150 steps" "$work/$form.log" || { echo "no loss ($form)"; exit 1; }
done
step "done"
