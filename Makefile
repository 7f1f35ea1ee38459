# Every target installs what is missing, configures and builds before it runs anything.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# Another LibTorch than Debian's (one with CUDA): a LibTorch folder, or a Python torch's
# torch.utils.cmake_prefix_path. Best with a build folder of its own: BUILD_DIR=build-cuda.
TORCH_DIR ?=
TORCH_FLAGS = $(if $(TORCH_DIR),-DCMAKE_PREFIX_PATH=$(TORCH_DIR))

.PHONY: deps configure configure-tests build test bench demo fuzz sanitize clean format

deps:
	@bash scripts/install-deps.sh

$(BUILD_DIR)/build.ninja: | deps
	cmake -S . -B $(BUILD_DIR) -G Ninja $(TORCH_FLAGS) $(CMAKE_FLAGS)

configure: deps $(BUILD_DIR)/build.ninja

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# What only tests need (clang-14 for the fuzz targets, Python's torch, Open MPI, Slurm), then the
# build configured again so that it finds them.
configure-tests: configure
	@bash scripts/install-deps.sh --tests
	cmake -S . -B $(BUILD_DIR) -G Ninja $(TORCH_FLAGS) $(CMAKE_FLAGS)

test: configure-tests
	cmake --build $(BUILD_DIR) -j $(JOBS)
	cd $(BUILD_DIR) && ctest --output-on-failure --timeout 300 -j 2

# The frame decoder and handshake under libFuzzer for FUZZ_SECONDS; new inputs it finds go to
# build/fuzz/corpus, crashes to build/fuzz/crash-*.
FUZZ_SECONDS ?= 600
fuzz: configure-tests
	cmake --build $(BUILD_DIR) -j $(JOBS)
	mkdir -p $(BUILD_DIR)/fuzz/corpus
	ASAN_OPTIONS=detect_leaks=0 $(BUILD_DIR)/fuzz/frame_fuzzer -max_total_time=$(FUZZ_SECONDS) \
	  -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix=$(BUILD_DIR)/fuzz/ \
	  $(BUILD_DIR)/fuzz/corpus fuzz/corpus/frames

# Every test built with AddressSanitizer and UndefinedBehaviorSanitizer, in build-sanitize.
# LibTorch keeps some allocations until exit on purpose, so leak reports are off. ASan reports go
# to files, so that one from a worker process a test started is seen too; UBSan ends the process
# it finds something in and prints to its stderr. Any report fails the run.
SANITIZER_REPORTS = $(CURDIR)/build-sanitize/reports
sanitize: deps
	cmake -S . -B build-sanitize -G Ninja -DFERRY_SANITIZE=ON -DFERRY_FUZZ=OFF $(CMAKE_FLAGS)
	cmake --build build-sanitize -j $(JOBS)
	rm -rf $(SANITIZER_REPORTS) && mkdir -p $(SANITIZER_REPORTS)
	cd build-sanitize && \
	  { ASAN_OPTIONS=detect_leaks=0:log_path=$(SANITIZER_REPORTS)/asan \
	    UBSAN_OPTIONS=print_stacktrace=1 \
	    ctest --output-on-failure -j 2 2>&1; echo $$? > $(SANITIZER_REPORTS)/.status; } \
	  | tee $(SANITIZER_REPORTS)/.ctest.log; \
	  grep -h -A20 "runtime error:" $(SANITIZER_REPORTS)/.ctest.log && exit 1; \
	  if [ -n "$$(ls $(SANITIZER_REPORTS))" ]; then \
	    cat $(SANITIZER_REPORTS)/*; echo "ASan reports: $(SANITIZER_REPORTS)"; exit 1; \
	  fi; exit $$(cat $(SANITIZER_REPORTS)/.status)

bench: build
	$(BUILD_DIR)/bin/ferry-bench rpc

# A master and three workers on this machine train the U-Net-ResNet-34 on the synthetic set. Only
# the three binaries it runs are built first (the tests and benchmarks build with `make test`).
DEMO_LOG_DIR ?= $(BUILD_DIR)/demo
demo: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target ferry-master ferry-worker ferry-launch
	$(BUILD_DIR)/bin/ferry-launch --nproc 4 -- $(BUILD_DIR)/bin/ferry-master train \
	  --model unet-resnet34 --data synthetic --image-size 64 --samples 384 --epochs 5 \
	  --batch-size 8 --optimizer adam --lr 0.003 --log-dir $(DEMO_LOG_DIR)

clean:
	rm -rf $(BUILD_DIR)

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')
