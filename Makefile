# The two commands of README: `make run` and `make test`. Everything else is a step of theirs.
JOBS ?= $(shell nproc)
PRESET ?= release
BUILD := build
XPERT := $(BUILD)/xpert
MODEL ?= models/default.gguf

.PHONY: run test deps build build-ci unit pytest fuzz clean bench

deps:
	scripts/setup.sh

build: deps
	cmake --preset $(PRESET) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

# What `make run` builds (every CUDA architecture of the release preset), with warnings as errors: a target
# that does not build, or warns, for any listed architecture fails `make test` too.
build-ci:
	scripts/setup.sh --test
	cmake --preset ci >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

PORT ?= 8080

run: build
	@echo "--- xpert serve -m $(MODEL) on http://127.0.0.1:$(PORT) (chat page: open that address in a browser)"
	@echo "--- query it from another terminal:"
	@echo "  curl http://127.0.0.1:$(PORT)/v1/chat/completions -H 'Content-Type: application/json' \\"
	@echo "    -d '{\"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of France?\"}], \"max_tokens\": 64}'"
	exec $(XPERT) serve -m $(MODEL) --port $(PORT)

test: build-ci
	cd $(BUILD) && ctest --output-on-failure -j 2
	python3 -m pytest -q tests/cli
	python3 -m pytest -q tests/server
	scripts/fuzz.sh 20

bench: build
	$(XPERT) bench -m $(MODEL)

clean:
	rm -rf build build-debug build-fuzz
