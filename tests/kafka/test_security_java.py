"""Kafka's Java client and its own tools over SASL_SSL (SCRAM-SHA-512, a CA made by the test, PEM trust store) against
an agent with ACLs: `kafka-configs.sh` adds a user's SCRAM credential (AlterUserScramCredentials) and describes it,
`kafka-acls.sh` grants it a topic and a group, the Java producer and consumer (`kafka-clients` from Maven Central)
then produce and consume as that user; and the errors the Java side reports are Kafka's: a tool run by a user
without ALTER on the cluster, a user no credential names, a topic the user was not granted."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from lab.servers.kafka import JavaProgram, build_java_program, kafka_missing_reason, tool_argv
from logcompact.catalog import Catalog
from logcompact.catalog.credentials import new_credential
from logcompact.kafka.authorizer import AuthorizerSettings
from logcompact.kafka.cluster import Address
from logcompact.kafka.listeners import Listener, SecurityProtocol
from logcompact.kafka.tls import TlsSettings
from tests.kafka.agents import FLUSH_MS, RunningAgent

pytestmark = pytest.mark.timeout(900)

JAVA_PROJECT = Path(__file__).parents[1] / "java"
PRODUCE_CONSUME = "logcompact.clients.ProduceConsume"
ADMIN, ADMIN_PASSWORD = "admin", "admin-Pl4nted-java-s3cret"
CAROL, CAROL_PASSWORD = "carol", "carol-Pl4nted-java-s3cret"
TOOL_TIMEOUT_S = 180  # a JVM's start on a loaded two-core machine


@pytest.fixture(scope="module")
def java() -> JavaProgram:
    missing = kafka_missing_reason()
    if missing:
        pytest.skip(missing)
    return build_java_program(JAVA_PROJECT)


@pytest.fixture
def agent(catalog: Catalog, tmp_path: Path) -> Iterator[RunningAgent]:
    authority = trustme.CA()
    served = authority.issue_cert("127.0.0.1", "localhost")
    (tmp_path / "ca.pem").write_bytes(authority.cert_pem.bytes())
    served.cert_chain_pems[0].write_to_path(str(tmp_path / "agent.pem"))
    served.private_key_pem.write_to_path(str(tmp_path / "agent.key"))
    catalog.ensure_created(1_700_000_000_000)
    catalog.put_scram_credential(ADMIN, new_credential("SCRAM-SHA-512", ADMIN_PASSWORD, 4096))
    running = RunningAgent(catalog, (Listener(SecurityProtocol.SASL_SSL, Address("127.0.0.1", 0)),), flush_interval_ms=FLUSH_MS,
                           sasl_mechanisms=("SCRAM-SHA-512",), tls=TlsSettings(tmp_path / "agent.pem", tmp_path / "agent.key"),
                           authorization=AuthorizerSettings("acl", (f"User:{ADMIN}",), False, 200))
    try:
        yield running
    finally:
        running.stop()


def client_properties(directory: Path, user: str, password: str) -> Path:
    """A Java client's settings for SASL_SSL as `user`, as Kafka's tools take them (--command-config)."""
    path = directory / f"{user}.properties"
    path.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
        f'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="{user}" password="{password}";\n'
        f"ssl.truststore.type=PEM\nssl.truststore.location={directory / 'ca.pem'}\n"
    )
    return path


def tool(main_class: str, agent: RunningAgent, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(tool_argv(main_class, "--bootstrap-server", agent.bootstrap, "--command-config", str(config), *args),
                          capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)


def kafka_configs(agent: RunningAgent, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return tool("org.apache.kafka.tools.ConfigCommand", agent, config, *args)


def kafka_acls(agent: RunningAgent, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return tool("org.apache.kafka.tools.AclCommand", agent, config, *args)


def produce_consume(java: JavaProgram, agent: RunningAgent, config: Path, topic: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(java.argv(PRODUCE_CONSUME, "--bootstrap-server", agent.bootstrap, "--topic", topic, "--num-records", "10",
                                    "--timeout-ms", "60000", "--command-config", str(config)),
                          capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)


def events(run: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in run.stdout.splitlines()]


def test_kafka_configs_adds_a_user_kafka_acls_grants_it_and_the_java_client_produces_and_consumes_as_it(
    java: JavaProgram, agent: RunningAgent, tmp_path: Path
) -> None:
    admin = client_properties(tmp_path, ADMIN, ADMIN_PASSWORD)
    added = kafka_configs(agent, admin, "--alter", "--add-config", f"SCRAM-SHA-512=[iterations=8192,password={CAROL_PASSWORD}]",
                          "--entity-type", "users", "--entity-name", CAROL)
    assert added.returncode == 0, added.stderr
    described = kafka_configs(agent, admin, "--describe", "--entity-type", "users", "--entity-name", CAROL)
    assert described.returncode == 0 and "SCRAM-SHA-512=iterations=8192" in described.stdout, (described.stdout, described.stderr)
    for args in (("--operation", "Write", "--operation", "Read", "--topic", "orders"), ("--operation", "Read", "--group", "*")):
        granted = kafka_acls(agent, admin, "--add", "--allow-principal", f"User:{CAROL}", *args)
        assert granted.returncode == 0, granted.stderr
    listed = kafka_acls(agent, admin, "--list", "--topic", "orders")
    assert f"principal=User:{CAROL}" in listed.stdout and "operation=WRITE" in listed.stdout, listed.stdout
    # The topic made by the admin: auto-creation needs CREATE, which carol was not given.
    topics = subprocess.run(tool_argv("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", agent.bootstrap, "--command-config", str(admin),
                                      "--create", "--topic", "orders", "--partitions", "2"), capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    assert topics.returncode == 0, topics.stderr
    carol = client_properties(tmp_path, CAROL, CAROL_PASSWORD)
    run = produce_consume(java, agent, carol, "orders")
    assert run.returncode == 0, run.stderr[-4000:]
    produced = sorted((e["partition"], e["offset"]) for e in events(run) if e["event"] == "produced")
    consumed = sorted((e["partition"], e["offset"]) for e in events(run) if e["event"] == "consumed")
    assert len(produced) == 10 and consumed == produced


def test_the_java_side_reports_kafkas_errors(java: JavaProgram, agent: RunningAgent, tmp_path: Path) -> None:
    agent.server.catalog.put_scram_credential(CAROL, new_credential("SCRAM-SHA-512", CAROL_PASSWORD, 4096))
    carol = client_properties(tmp_path, CAROL, CAROL_PASSWORD)
    not_allowed = kafka_acls(agent, carol, "--add", "--allow-principal", f"User:{CAROL}", "--operation", "All", "--topic", "*")
    assert "ClusterAuthorizationException" in not_allowed.stdout + not_allowed.stderr, (not_allowed.stdout, not_allowed.stderr)
    not_a_user = produce_consume(java, agent, client_properties(tmp_path, "dave", "whatever-password"), "orders")
    assert not_a_user.returncode == 1
    assert "SaslAuthenticationException" in not_a_user.stderr and "invalid credentials with SASL mechanism SCRAM-SHA-512" in not_a_user.stderr
    not_granted = produce_consume(java, agent, carol, "secrets")
    assert not_granted.returncode == 1 and "TopicAuthorizationException" in not_granted.stderr, not_granted.stderr[-2000:]
