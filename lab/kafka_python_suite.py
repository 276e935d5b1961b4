"""kafka-python's own integration tests, from its sdist, run against a Kafka-protocol server of ours.

    python -m lab.kafka_python_suite fetch     # the sdist into the cache (what `make test` runs first)

The sdist (`pip download --no-deps --no-binary :all: kafka-python==VERSION`) carries `test/integration`; its
conftest uses an external broker when KAFKA_URI names one (`run` sets it, with KAFKA_VERSION, the broker version
its tests take the server for). It is unpacked once into ~/.cache/logcompact/kafka-python (or
$LOGCOMPACT_KAFKA_PYTHON_CACHE), beside Kafka's jars. `tests/kafka/test_kafka_python_suite.py` runs the tests it
selects against a `logcompact agent`, each as a test of ours.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from lab.servers.kafka import into_cache

KAFKA_PYTHON_VERSION = "3.0.12"  # requirements.txt's: the client these tests were written for
CACHE_ENV = "LOGCOMPACT_KAFKA_PYTHON_CACHE"
PIP_TIMEOUT_S = 300
TEST_TIMEOUT_S = 600


class SuiteError(RuntimeError):
    """The sdist could not be had; the message says what to do."""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "logcompact" / "kafka-python").expanduser()


def fetch(version: str = KAFKA_PYTHON_VERSION) -> Path:
    """The unpacked sdist of kafka-python `version` (its root, holding `test/integration`), downloaded by pip into the
    cache the first time."""

    def download(into: Path) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                       f"kafka-python=={version}", "--dest", scratch]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise SuiteError(f"`{' '.join(command)}` did not finish in {PIP_TIMEOUT_S} s: check the network to PyPI") from None
            if done.returncode != 0:
                raise SuiteError(f"`{' '.join(command)}` exited with {done.returncode}: {(done.stdout + done.stderr)[-2000:]}")
            [archive] = Path(scratch).glob("kafka_python-*.tar.gz")
            with tarfile.open(archive) as sdist:
                sdist.extractall(into, filter="data")
            [root] = into.iterdir()
            for entry in root.iterdir():
                entry.rename(into / entry.name)
            root.rmdir()

    root = into_cache(cache_dir() / f"kafka_python-{version}", download)
    if not (root / "test" / "integration" / "conftest.py").is_file():
        raise SuiteError(f"{root} holds no test/integration/conftest.py: remove it and fetch again")
    return root


def run(root: Path, test_id: str, bootstrap: str, kafka_version: str, timeout_s: float = TEST_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """One test of the sdist (`test/integration/FILE::NAME`) run by pytest in its root against the broker at
    `bootstrap` (host:port, PLAINTEXT), told it is Kafka `kafka_version`."""
    # Its fixtures check that KAFKA_ROOT (a Kafka distribution) is a directory, though nothing of an external
    # broker's is run from it: an empty one of the cache's.
    kafka_root = cache_dir() / "external-broker"
    kafka_root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "KAFKA_VERSION": kafka_version, "KAFKA_URI": f"PLAINTEXT://{bootstrap}", "KAFKA_ROOT": str(kafka_root)}
    args = ["-p", "no:cacheprovider", "-q", "-rA", "--no-header", str(Path("test") / "integration" / test_id)]
    command = [sys.executable, "-c", _RUNNER, *args]
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s)


# pytest with the sdist's `test` directory as the package `test`: it has no __init__.py, so Python's own `test`
# package, where the interpreter has one, would be imported for its conftest's `from test.testutil import ...`.
# The sdist leaves out `test/service.py`, whose ExternalService its fixtures make for a KAFKA_URI broker and never
# call (an external broker is neither started nor stopped; its log is the agent's own) and whose SpawnedService
# starts a Kafka of the sdist's own: `test.service` here has both, the latter refusing with the reason.
_RUNNER = """
import sys, types
package = types.ModuleType("test")
package.__path__ = ["test"]
sys.modules["test"] = package


class ExternalService:
    def __init__(self, host, port):
        self.host, self.port = host, port

    def dump_logs(self):
        print(f"external broker {self.host}:{self.port}: its log is the agent's own")


class SpawnedService:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("kafka-python's suite runs here against the broker KAFKA_URI names; set it")


service = types.ModuleType("test.service")
service.ExternalService, service.SpawnedService = ExternalService, SpawnedService
sys.modules["test.service"] = package.service = service
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.kafka_python_suite", description=f"kafka-python's integration tests (cache: {cache_dir()}).")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fetch", help=f"fetch kafka-python {KAFKA_PYTHON_VERSION}'s sdist into the cache")
    parser.parse_args(argv)
    try:
        root = fetch()
    except SuiteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"kafka_python_sdist": str(root)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
