# Every target installs what is missing, configures and builds before it runs anything.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: deps configure build test bench demo clean format

deps:
	@bash scripts/install-deps.sh

$(BUILD_DIR)/build.ninja: | deps
	cmake -S . -B $(BUILD_DIR) -G Ninja $(CMAKE_FLAGS)

configure: deps $(BUILD_DIR)/build.ninja

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure --timeout 300 -j 2

bench: build
	$(BUILD_DIR)/bin/ferry-bench rpc

# A master and three workers on this machine train the U-Net-ResNet-34 on the synthetic set.
demo: build
	$(BUILD_DIR)/bin/ferry-launch --nproc 4 -- $(BUILD_DIR)/bin/ferry-master train \
	  --model unet-resnet34 --data synthetic --image-size 64 --samples 384 --epochs 5 \
	  --batch-size 8 --optimizer adam --lr 0.003

clean:
	rm -rf $(BUILD_DIR)

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')
