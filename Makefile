# Thin wrapper over CMake. `make demo` and `make test` install what is missing, configure, build,
# and run; both are safe to run again.
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps configure build demo test check-sanitize check-fuzz check-valgrind format check-format clean install

all: build

deps:
	@./tools/install_deps.sh

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The main job: examples/moe_train on DEMO_RANKS ranks (cp 2, dp_shard 2, ep 2 on 4), about a
# minute on 2 cores. Root-safe and oversubscribed; one BLAS/OpenMP thread per rank.
DEMO_RANKS ?= 4
DEMO_ARGS  ?=
demo: build
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1 \
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
	mpiexec -n $(DEMO_RANKS) --oversubscribe $(BUILD)/examples/moe_train $(DEMO_ARGS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# libFuzzer (clang, ASan + UBSan) on the config loader, the key=value setter and env overlay, the
# safetensors header parser and the checkpoint index checks, FUZZ_SECONDS each from the committed
# corpus (tests/fuzz/run.sh).
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
check-fuzz:
	@./tools/install_deps.sh --fuzz
	CC=clang cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDOPT_FUZZ=ON -DSHARDOPT_WITH_CUDA=OFF $(CMAKE_ARGS)
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_config fuzz_config_set fuzz_safetensors fuzz_index fuzz_writer_index
	tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

# valgrind memcheck over the unit suite of the main build: zero errors and zero definite leaks
# (system libraries suppressed in tests/valgrind.supp). About 10 minutes on 2 cores: not in CI.
check-valgrind: build
	python3 tests/valgrind_unit.py $(BUILD)

# ASan + UBSan build (CPU only), running the unit and MPI tests.
check-sanitize: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DSHARDOPT_SANITIZE=ON -DSHARDOPT_WITH_CUDA=OFF $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ctest --test-dir $(ASAN_BUILD) --output-on-failure -L 'unit|mpi' -j $(JOBS)

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu')

check-format:
	clang-format --dry-run -Werror $$(git ls-files '*.c' '*.h' '*.cu')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)

# Install the library, header, pkg-config file and CMake package (find_package(shardopt)).
PREFIX ?= /usr/local
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)
