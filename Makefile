# Thin wrapper around CMake. The two commands of the README:
#   make run   installs what is missing, builds, starts kvserve on 127.0.0.1:8080 with the embedded model
#   make test  installs what is missing, builds, runs every test (plain build, ASan+UBSan build, then the
#              container image built with podman and smoke-tested, skipped with a message where no container can run)
#   make fuzz  builds the libFuzzer harnesses with clang (build-fuzz/) and runs each for FUZZ_SECONDS (default 60)
#   make soak  SOAK_MINUTES (default 5) of streaming load with aborts, a tiny KV pool and preemption against
#              build/kvserve: output equal to the run alone at temperature 0, no leak, metrics back to idle
#   make test-tsan  the same load for TSAN_SOAK_MINUTES (default 1) against a ThreadSanitizer build (build-tsan/)
BUILD      ?= build
BUILD_SAN  ?= build-san
BUILD_FUZZ ?= build-fuzz
BUILD_TSAN ?= build-tsan
FUZZ_SECONDS ?= 60
SOAK_MINUTES ?= 5
TSAN_SOAK_MINUTES ?= 1
SHARED     ?= $(CURDIR)/../shared
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=

.PHONY: all deps build build-san run test test-fast test-san test-docker fuzz soak test-tsan clean

all: build

deps:
	@bash scripts/install-deps.sh
	@test -d tests/e2e/node_modules/openai -a -d tests/e2e/node_modules/puppeteer-core \
	  -a -d tests/e2e/node_modules/@anthropic-ai/sdk || \
	  npm ci --prefix tests/e2e --no-audit --no-fund

build: deps
	cmake -S . -B $(BUILD) $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS)

build-san: deps
	cmake -S . -B $(BUILD_SAN) -DKVSERVE_SANITIZE=address,undefined -DKVSERVE_CUDA=OFF $(CMAKE_ARGS)
	cmake --build $(BUILD_SAN) -j $(JOBS)

run: build
	bash scripts/run-default.sh $(BUILD)/kvserve

test-fast: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

test-san: build-san
	ctest --test-dir $(BUILD_SAN) --output-on-failure -j $(JOBS) -LE nosan

test: test-fast test-san
	bash tests/docker/run.sh --auto

# Builds the image with podman and smoke-tests the container (about 1.5 minutes; fails where podman cannot run).
test-docker: deps
	bash tests/docker/run.sh

# libFuzzer harnesses (fuzz/): clang with ASan+UBSan, the libraries instrumented for coverage. FUZZ=NAME runs one.
fuzz:
	@bash scripts/install-deps.sh fuzz
	cmake -S . -B $(BUILD_FUZZ) -DCMAKE_C_COMPILER=clang -DKVSERVE_CUDA=OFF -DKVSERVE_SANITIZE=address,undefined \
	  -DKVSERVE_FUZZ=ON -DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link $(CMAKE_ARGS)
	cmake --build $(BUILD_FUZZ) -j $(JOBS) --target fuzz-all
	bash fuzz/run.sh $(BUILD_FUZZ) $(FUZZ_SECONDS) $(FUZZ)

# The soak (tests/soak/soak.mjs; not part of `make test`): SOAK_JSON=FILE also writes the figures there.
soak: build
	KVSERVE_BINARY=$(CURDIR)/$(BUILD)/kvserve KVSERVE_SHARED=$(SHARED) SOAK_MINUTES=$(SOAK_MINUTES) \
	  node tests/soak/soak.mjs

# ThreadSanitizer: kvserve built with -fsanitize=thread, its threads (the libuv loop, the scheduler, the
# prepare workers on libuv's pool, the engine's workers) driven by the soak's concurrent streaming and aborted
# requests; any ThreadSanitizer report fails it.
test-tsan: deps
	cmake -S . -B $(BUILD_TSAN) -DKVSERVE_SANITIZE=thread -DKVSERVE_CUDA=OFF $(CMAKE_ARGS)
	cmake --build $(BUILD_TSAN) -j $(JOBS) --target kvserve
	KVSERVE_BINARY=$(CURDIR)/$(BUILD_TSAN)/kvserve KVSERVE_SHARED=$(SHARED) SOAK_MINUTES=$(TSAN_SOAK_MINUTES) \
	  SOAK_TSAN=1 SOAK_CLIENTS=12 node tests/soak/soak.mjs

clean:
	rm -rf $(BUILD) $(BUILD_SAN) $(BUILD_FUZZ) $(BUILD_TSAN)
