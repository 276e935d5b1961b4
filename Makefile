# The README's commands. Everything the project needs is installed from here on a fresh machine
# (Python 3.11 and Java 17 given): a virtualenv from requirements.txt, from Debian's packages Ceph's RADOS Gateway
# for the real S3 test suite and PostgreSQL for the catalog's PostgreSQL tests, and from Maven Central Apache Kafka's
# broker and Java client, the reference the Kafka agent is compared with.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
QUIX_VENV := .venv-quixstreams
CEPH_BINARIES := radosgw ceph-mon ceph-osd

.PHONY: install deps kafka kafka-python-suite quixstreams lint test demo airflow bench simulate clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

$(VENV)/.installed: requirements.txt pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $@

install: $(VENV)/.installed

# Installed with apt-get when missing: Ceph RGW, a real S3-compatible server for the S3 suite, and the
# PostgreSQL server binaries (/usr/lib/postgresql/VERSION/bin) for the catalog's PostgreSQL tests, and kcat
# (librdkafka's command-line client) for the Kafka agent's tests, and Java 17 and Maven for Apache Kafka's broker and
# Java client (`make kafka`). Nothing is started here: the tests and the benchmarks start their own servers
# (lab.servers: rgw.py, postgres.py, kafka.py).
deps:
	@pkgs=""; missing=""; for b in $(CEPH_BINARIES); do command -v $$b >/dev/null || missing="$$missing $$b"; done; \
	if [ -n "$$missing" ]; then echo "installing Ceph RGW (missing:$$missing)"; pkgs="radosgw ceph-mon ceph-osd"; fi; \
	if ! compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null; then \
	  echo "installing PostgreSQL (no /usr/lib/postgresql/*/bin/postgres)"; pkgs="$$pkgs postgresql"; \
	fi; \
	if ! command -v kcat >/dev/null; then echo "installing kcat (missing)"; pkgs="$$pkgs kcat"; fi; \
	if ! command -v javac >/dev/null; then echo "installing Java 17 (no javac)"; pkgs="$$pkgs openjdk-17-jdk-headless"; fi; \
	if ! command -v mvn >/dev/null; then echo "installing Maven (missing)"; pkgs="$$pkgs maven"; fi; \
	if [ -n "$$pkgs" ]; then \
	  if [ "$$(id -u)" != 0 ]; then SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$pkgs >/dev/null; \
	fi

# Apache Kafka's broker and tools jars (org.apache.kafka:kafka_2.13 and kafka-tools, 44 MB) fetched by Maven, and the
# tests' Java client program (tests/java) built, into the cache the tests and benchmarks share
# (~/.cache/logcompact/kafka, or $LOGCOMPACT_KAFKA_CACHE): about a minute the first time on a fresh machine, nothing
# after (lab/servers/kafka.py).
kafka: install deps
	$(BIN)/python -m lab.servers.kafka fetch tests/java

# kafka-python's sdist (pip download, from PyPI), whose own integration tests tests/kafka/test_kafka_python_suite.py
# runs against an agent, unpacked into ~/.cache/logcompact/kafka-python (lab/kafka_python_suite.py).
kafka-python-suite: install
	$(BIN)/python -m lab.kafka_python_suite fetch

# quixstreams in a virtualenv of its own (requirements-quixstreams.txt: it needs an older confluent-kafka than the
# project's), run as a process by tests/kafka/test_quixstreams.py.
$(QUIX_VENV)/.installed: requirements-quixstreams.txt
	$(PYTHON) -m venv $(QUIX_VENV) || python3 -m venv $(QUIX_VENV)
	$(QUIX_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(QUIX_VENV)/bin/python -m pip install --quiet -r requirements-quixstreams.txt
	touch $@

quixstreams: $(QUIX_VENV)/.installed

# Configured in pyproject.toml: the rules and paths are there.
lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

# The agent's compiled loops are compiled (into numba's cache beside the sources) before the suite, whose first tests
# are the agent's: a fresh clone's first agent would otherwise spend most of a test's time bound compiling them.
test: install deps kafka kafka-python-suite quixstreams lint
	$(BIN)/python -c "from logcompact.kafka import records; from logcompact.format import xxh3; from logcompact.engine import cleaner; from logcompact import sketch; records.compile_decoder(); records.compile_encoder(); xxh3.compile_hasher(); sketch.compile_sketcher(); cleaner.compile_kernels()"
	$(BIN)/python -m pytest

# The whole product on a local store: data, the four DAGs through dag.test() with Spark local, a report.
demo: install
	$(BIN)/python scripts/demo.py

# Airflow 3 on http://127.0.0.1:8080 with the DAGs, their connections and pool; a Kafka agent on 127.0.0.1:9092.
# Ctrl-C stops every process it started (scripts/airflow.sh).
airflow: install
	scripts/airflow.sh

# Each script replaces its command's section of bench/results.md with the figures it printed (bench/results.py).
bench: install deps kafka
	$(BIN)/python bench/produce_consume.py
	$(BIN)/python bench/agent.py
	$(BIN)/python bench/frame_read.py
	$(BIN)/python bench/engine.py
	$(BIN)/python bench/partitions.py
	$(BIN)/python bench/planner.py
	$(BIN)/python bench/planner.py --files 300000 --runs 1
	$(BIN)/python bench/status.py
	$(BIN)/python bench/status.py --files 250000
	$(BIN)/python bench/catalog.py
	$(BIN)/python bench/spark_dedup.py
	$(BIN)/python bench/spark_dedup.py --records 40000000 --keys 4000000
	$(BIN)/python bench/simulator.py --hours 24
	$(BIN)/python bench/regime.py --seconds 120 --find-load
	$(BIN)/python bench/regime.py --agents 3 --seconds 600
	$(BIN)/python bench/regime.py --database postgresql --agents 10 --seconds 180

simulate: install
	$(BIN)/logcompact simulate --agents 1 --agents 10 --hours 24 --out .simulate

clean:
	rm -rf $(VENV) $(QUIX_VENV) .demo .airflow .bench .simulate .pytest_cache .hypothesis
