# Thin wrapper around CMake. The two commands of the README:
#   make run   installs what is missing, builds, starts kvserve on 127.0.0.1:8080 with the embedded model
#   make test  installs what is missing, builds, runs every test (plain build, ASan+UBSan build, then the
#              container image built with podman and smoke-tested, skipped with a message where no container can run)
#   make fuzz  builds the libFuzzer harnesses with clang (build-fuzz/) and runs each for FUZZ_SECONDS (default 60)
BUILD      ?= build
BUILD_SAN  ?= build-san
BUILD_FUZZ ?= build-fuzz
FUZZ_SECONDS ?= 60
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=

.PHONY: all deps build build-san run test test-fast test-san test-docker fuzz clean

all: build

deps:
	@bash scripts/install-deps.sh
	@test -d tests/e2e/node_modules/openai -a -d tests/e2e/node_modules/puppeteer-core || \
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

clean:
	rm -rf $(BUILD) $(BUILD_SAN) $(BUILD_FUZZ)
