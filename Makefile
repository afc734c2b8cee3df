# vmfabric — quick start: `make demo` then `make test`.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo
BIN := target/release/vmfabric

.PHONY: all deps build demo test bench doc clean-regions

all: build

# Everything beyond the machine's toolchains, installed idempotently.
deps:
	@bash scripts/deps.sh

build: deps
	$(CARGO) build --release --workspace
	bash mpi/install.sh

# The main job: 4 ranks on this host exchange messages through shared memory (pairs 0-1 and 2-3 at once)
# and rank 0 prints a latency/bandwidth table.
demo: build
	$(BIN) run -n 4 $(BIN) bench demo --sizes 8,64,512,4K,16K,64K,256K,1M,4M --iters 5000

# The whole suite: unit, concurrency and multi-process integration tests, then MPICH's own test suite
# (its C programs, built with Debian's MPICH wrappers, run over vmfabric: scripts/mpich-testsuite.sh), then
# mpi4py's (built against MPICH, run over vmfabric at 1 and 2 ranks: scripts/mpi4py-testsuite.sh;
# VMF_MPI4PY=0 skips it).
test: build
	$(CARGO) test --release --workspace -- --test-threads=2
	bash scripts/mpich-testsuite.sh
	bash scripts/mpi4py-testsuite.sh

# Side-by-side with MPICH and Open MPI; results under bench/results/.
bench: build
	bash bench/run.sh

doc:
	$(CARGO) doc --workspace --no-deps

clean-regions: build
	$(BIN) clean
