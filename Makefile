# The two commands of README: `make run` and `make test`. Everything else is a step of theirs.
JOBS ?= $(shell nproc)
PRESET ?= release
BUILD := build
XPERT := $(BUILD)/xpert
MODEL ?= models/default.gguf
PROMPT ?= The capital of France is

.PHONY: run test deps build build-ci unit pytest fuzz clean bench

deps:
	scripts/setup.sh

build: deps
	cmake --preset $(PRESET) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

build-ci: deps
	cmake --preset ci >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

run: build
	@echo "--- xpert run -m $(MODEL) -p \"$(PROMPT)\" -n 64 --temp 0"
	$(XPERT) run -m $(MODEL) -p "$(PROMPT)" -n 64 --temp 0

test: build-ci
	cd $(BUILD) && ctest --output-on-failure -j 2
	python3 -m pytest -q tests/cli
	scripts/fuzz.sh 20

bench: build
	$(XPERT) bench -m $(MODEL)

clean:
	rm -rf build build-debug build-fuzz
