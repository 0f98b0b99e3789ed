# attograd: the two set-up commands are `make demo` and `make test` (see README.md).
BUILD   ?= build
JOBS    ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test bench compare clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) > $(BUILD).configure.log 2>&1 || { cat $(BUILD).configure.log; exit 1; }

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# Trains the vision transformer on Fashion-MNIST (a few minutes on 2 cores) and prints the test
# accuracy, where its plots went, and how to train the other two apps.
demo: build
	@./$(BUILD)/vit --out runs/vit
	@echo "plots: runs/vit/curves.svg (loss, accuracy), runs/vit/attention.svg (where the class token looks)"
	@echo "next:  ./$(BUILD)/textclf (language identification on Debian's fortunes),"
	@echo "       ./$(BUILD)/gpt (a char-level GPT on the King James Bible); --help lists every option"

# The whole suite: every doctest case is one CTest entry.
test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

bench: build
	@scripts/bench.sh $(BUILD)

# attograd beside PyTorch (pip's newest in a venv it creates, and Debian's python3-torch when
# installed): training steps, scaling, attention, generation; tables also in $(BUILD)/compare_pytorch.md.
compare: build
	@scripts/install-deps.sh --bench
	@bench/compare_pytorch --build $(BUILD) --markdown $(BUILD)/compare_pytorch.md

clean:
	rm -rf $(BUILD) $(BUILD).configure.log
