"""`logcompact agent`: Kafka's protocol over this cluster (docs/agent.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from logcompact.cli.agent_processes import available_cores, check_processes, run_processes
from logcompact.cli.common import Context, emit, pass_context
from logcompact.exceptions import ClusterNotFoundError
from logcompact.limits import (
    DEFAULT_FLUSH_BYTES,
    DEFAULT_FLUSH_INTERVAL_MS,
    DEFAULT_SSL_HANDSHAKE_TIMEOUT_MS,
    DEFAULT_SSL_PRINCIPAL_MAPPING_RULES,
    FILL_MS,
    SSL_KEY_PASSWORD_ENV,
)
from logcompact.topics import MAX_PARTITIONS

if TYPE_CHECKING:
    from logcompact.catalog import Catalog
    from logcompact.kafka.broker import Broker
    from logcompact.kafka.cluster import Address


@click.command()
@click.option("--listen", multiple=True, metavar="[PROTOCOL://]HOST:PORT",
              help="A listener to accept Kafka clients on (Kafka's listeners), repeatable, each protocol once: PLAINTEXT (HOST:PORT "
                   "alone), SSL, SASL_PLAINTEXT or SASL_SSL; port 0: any free port. [default: 127.0.0.1:9092]")
@click.option("--advertise", multiple=True, metavar="[PROTOCOL://]HOST:PORT",
              help="Where clients of a listener are told to connect (Kafka's advertised.listeners), repeatable, one per listener "
                   "[default: the listener's address].")
@click.option("--allow-insecure-listener", is_flag=True, default=False,
              help="Allow a PLAINTEXT listener, or PLAIN passwords on a SASL_PLAINTEXT one, on an address other than loopback "
                   "(records and passwords then cross the network in the clear).")
@click.option("--ssl-certfile", type=click.Path(dir_okay=False, path_type=Path), envvar="LOGCOMPACT_SSL_CERTFILE",
              help="PEM certificate of the SSL and SASL_SSL listeners, then its chain (Kafka's ssl.keystore.location, in PEM) "
                   "[env LOGCOMPACT_SSL_CERTFILE].")
@click.option("--ssl-keyfile", type=click.Path(dir_okay=False, path_type=Path), envvar="LOGCOMPACT_SSL_KEYFILE",
              help=f"PEM private key of --ssl-certfile; if encrypted, its password in the environment variable {SSL_KEY_PASSWORD_ENV} "
                   "[env LOGCOMPACT_SSL_KEYFILE].")
@click.option("--ssl-cafile", type=click.Path(dir_okay=False, path_type=Path), envvar="LOGCOMPACT_SSL_CAFILE",
              help="PEM certificates of the CAs client certificates must chain to (Kafka's ssl.truststore.location) [env LOGCOMPACT_SSL_CAFILE].")
@click.option("--ssl-client-auth", type=click.Choice(["required", "requested", "none"]), default="none", show_default=True,
              envvar="LOGCOMPACT_SSL_CLIENT_AUTH",
              help="Ask TLS clients for a certificate and refuse those without (required) or not (requested) (Kafka's ssl.client.auth) "
                   "[env LOGCOMPACT_SSL_CLIENT_AUTH].")
@click.option("--ssl-handshake-timeout-ms", type=click.IntRange(min=1), default=DEFAULT_SSL_HANDSHAKE_TIMEOUT_MS, show_default=True,
              envvar="LOGCOMPACT_SSL_HANDSHAKE_TIMEOUT_MS",
              help="Close a TLS connection whose handshake has not completed this long after connecting [env LOGCOMPACT_SSL_HANDSHAKE_TIMEOUT_MS].")
@click.option("--ssl-principal-mapping-rules", default=DEFAULT_SSL_PRINCIPAL_MAPPING_RULES, show_default=True, envvar="LOGCOMPACT_SSL_PRINCIPAL_MAPPING_RULES",
              help="How a client certificate's subject DN becomes its principal's name: RULE:pattern/replacement/[LU] or DEFAULT, "
                   "comma-separated, the first that matches wins (Kafka's ssl.principal.mapping.rules) [env LOGCOMPACT_SSL_PRINCIPAL_MAPPING_RULES].")
@click.option("--sasl-mechanisms", default="SCRAM-SHA-256,SCRAM-SHA-512", show_default=True, metavar="NAME[,NAME...]",
              help="The SASL mechanisms a SASL_PLAINTEXT or SASL_SSL listener accepts (Kafka's sasl.enabled.mechanisms): "
                   "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512. Users and their passwords: `logcompact user`.")
@click.option("--node-id", type=click.IntRange(min=0), default=None,
              help="Broker id clients see [default: the one this advertised address had before, else the lowest free one].")
@click.option("--rack", default=None, help="Rack (availability zone) clients see, for their rack-aware choices.")
@click.option("--flush-ms", type=click.IntRange(min=1), default=DEFAULT_FLUSH_INTERVAL_MS, show_default=True,
              help="Write and commit an L0 file of what producers sent at least this often; acks wait for it.")
@click.option("--flush-bytes", type=click.IntRange(min=1), default=DEFAULT_FLUSH_BYTES, show_default=True,
              help=f"Or as soon as this many bytes are buffered (divided among the processes), or a quarter of them "
                   f"within {FILL_MS} ms.")
@click.option("--max-message-bytes", type=click.IntRange(min=1), default=1_048_588, show_default=True,
              help="Largest record batch taken (Kafka's message.max.bytes; a topic's max.message.bytes overrides it).")
@click.option("--fetch-cache-bytes", type=click.IntRange(min=0), default=256 * 1024 * 1024, show_default=True,
              help="Bytes of file ranges kept for consumers that read them again (the tail); 0: no cache.")
@click.option("--fetch-block-cache-bytes", type=click.IntRange(min=0), default=64 * 1024 * 1024, show_default=True,
              help="Bytes of decoded blocks kept so consumers of one file decode each block once; 0: no cache.")
@click.option("--fetch-compression", type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]), default="none", show_default=True,
              help="Codec Fetch sends records in where their topic's compression.type is producer (Kafka's default) and the codec "
                   "they were produced with is not known (records written through the library or by an older agent).")
@click.option("--auto-create-topics/--no-auto-create-topics", default=True, show_default=True,
              help="Create a topic a producer or a Metadata request names that does not exist (Kafka's auto.create.topics.enable).")
@click.option("--num-partitions", type=click.IntRange(1, MAX_PARTITIONS), default=1, show_default=True,
              help="Partitions of a topic auto-created or created without a count (Kafka's num.partitions).")
# Kafka's group.max.size is unbounded; the agent keeps every member in memory (coordinator.DEFAULT_GROUP_MAX_SIZE)
@click.option("--group-max-size", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Members a consumer group may have (Kafka's group.max.size); more get GROUP_MAX_SIZE_REACHED.")
@click.option("--group-max-bytes", type=click.IntRange(min=1), default=256 * 1024 * 1024, show_default=True,
              help="Bytes all consumer groups' members may hold in memory (their metadata, assignments and ids, 1 KiB at least "
                   "each); JoinGroups past it get GROUP_MAX_SIZE_REACHED.")
@click.option("--offsets-commit-timeout-ms", type=click.IntRange(min=1), default=5000, show_default=True,
              help="Answer an offset commit, or a SyncGroup whose assignments are being written, COORDINATOR_NOT_AVAILABLE when "
                   "the catalog has not written it within this long (Kafka's offsets.commit.timeout.ms); the client retries.")
@click.option("--offsets-retention-minutes", type=click.IntRange(min=1), default=10080, show_default=True,
              help="Delete a consumer group's committed offsets this long after it was left Empty (and after their commit), then "
                   "the group; a standalone consumer's each this long after its commit (Kafka's offsets.retention.minutes).")
@click.option("--offsets-retention-check-interval-ms", type=click.IntRange(min=1), default=600_000, show_default=True,
              help="How often the agent expires the offsets of the groups it coordinates (Kafka's offsets.retention.check.interval.ms).")
@click.option("--max-connections", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Connections the agent holds (Kafka's max.connections); one more is closed as soon as it is accepted.")
@click.option("--max-connections-per-ip", type=click.IntRange(min=1), default=500, show_default=True,
              help="Connections the agent holds from one address (Kafka's max.connections.per.ip), so one cannot take them all.")
@click.option("--connections-max-idle-ms", type=click.IntRange(min=1), default=600_000, show_default=True,
              help="Close a connection with no request unanswered and nothing received for this long (Kafka's connections.max.idle.ms), "
                   "or whose client has taken none of its answers for this long.")
@click.option("--connection-setup-timeout-ms", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Close a connection that has not sent a whole request this long after connecting.")
@click.option("--request-read-timeout-ms", type=click.IntRange(min=1), default=30_000, show_default=True,
              help="Close a connection whose request is not all in this long after its first byte.")
@click.option("--transaction-max-timeout-ms", type=click.IntRange(min=1), default=900_000, show_default=True,
              help="Longest transaction.timeout.ms a transactional producer may ask for (Kafka's transaction.max.timeout.ms); "
                   "InitProducerId asking more gets INVALID_TRANSACTION_TIMEOUT.")
@click.option("--transactional-id-expiration-ms", type=click.IntRange(min=1), default=604_800_000, show_default=True,
              help="Forget a transactional id with no open transaction unused for this long (Kafka's transactional.id.expiration.ms).")
@click.option("--transaction-abort-timed-out-transaction-cleanup-interval-ms", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="How often the agent aborts the transactions it coordinates that are open past their timeout (Kafka's option of the same name).")
@click.option("--transaction-remove-expired-transaction-cleanup-interval-ms", type=click.IntRange(min=1), default=3_600_000, show_default=True,
              help="How often the agent forgets expired transactional ids (Kafka's option of the same name).")
@click.option("--authorizer", type=click.Choice(["acl"]), default=None,
              help="Check every request against Kafka's ACLs (Kafka's authorizer.class.name, StandardAuthorizer) [default: on only "
                   "when --super-users is given].")
@click.option("--super-users", metavar="PRINCIPAL;...", default=None,
              help="Principals allowed everything, whatever the ACLs (Kafka's super.users), separated by semicolons: User:alice;User:bob.")
@click.option("--allow-everyone-if-no-acl-found", is_flag=True, default=False,
              help="Allow a resource that no ACL names to everyone (Kafka's allow.everyone.if.no.acl.found) instead of denying it.")
@click.option("--acl-refresh-ms", type=click.IntRange(min=1), default=5000, show_default=True,
              help="Read the ACLs from the catalog this often: a change made elsewhere applies here within it.")
@click.option("--metrics-listen", metavar="HOST:PORT", default=None,
              help="Serve Prometheus metrics at http://HOST:PORT/metrics, under the JMX exporter's names of Kafka's MBeans "
                   "(docs/metrics.md); unauthenticated and unencrypted, so keep it on loopback or a private network [default: not served].")
@click.option("--processes", type=click.IntRange(min=1), default=None, envvar="LOGCOMPACT_AGENT_PROCESSES",
              help="Agent processes to run, each an agent of the cluster on ports of its own (listeners' ports + 0, 1, ...), the "
                   "memory budgets divided among them (docs/agent.md) [default: the cores it may run on; env LOGCOMPACT_AGENT_PROCESSES].")
@pass_context
def agent(
    ctx: Context, processes: int | None, listen: tuple[str, ...], advertise: tuple[str, ...], allow_insecure_listener: bool, sasl_mechanisms: str,
    node_id: int | None, rack: str | None, flush_ms: int, flush_bytes: int,
    max_message_bytes: int, fetch_cache_bytes: int, fetch_block_cache_bytes: int, fetch_compression: str, auto_create_topics: bool, num_partitions: int, group_max_size: int,
    group_max_bytes: int, offsets_commit_timeout_ms: int, offsets_retention_minutes: int, offsets_retention_check_interval_ms: int,
    max_connections: int, max_connections_per_ip: int, connections_max_idle_ms: int,
    connection_setup_timeout_ms: int, request_read_timeout_ms: int, transaction_max_timeout_ms: int, transactional_id_expiration_ms: int,
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int, transaction_remove_expired_transaction_cleanup_interval_ms: int,
    ssl_certfile: Path | None, ssl_keyfile: Path | None, ssl_cafile: Path | None, ssl_client_auth: str, ssl_handshake_timeout_ms: int,
    ssl_principal_mapping_rules: str,
    authorizer: str | None, super_users: str | None, allow_everyone_if_no_acl_found: bool, acl_refresh_ms: int, metrics_listen: str | None,
) -> None:
    """Serve Kafka's protocol over this cluster (produce, fetch, consumer groups, idempotent and transactional producers, admin; every API
    and version in docs/agent.md) until SIGTERM or SIGINT, then commit what producers sent. Registers in the catalog
    beside the other agents. Prints one JSON line once listening: its first listener's address, every listener's, the advertised
    address, node id, cluster id and where /metrics is served (null without --metrics-listen). With --processes N
    (default: the cores), N agent processes, each an agent of its own on ports of its own, one log, one JSON line once all
    listen (its `processes`: each one's). On an empty store (and catalog) it creates the cluster first, as `logcompact cluster create` does,
    saying so in one line on stderr; a store or catalog of another cluster is refused."""
    from logcompact.kafka.allocator import arrow_allocates_from_the_system

    arrow_allocates_from_the_system()  # first: Arrow reads its choice of pool as it loads (kafka/allocator.py)
    from logcompact.kafka.authenticator import parse_mechanisms
    from logcompact.kafka.authorizer import AuthorizerSettings
    from logcompact.kafka.cluster import Address
    from logcompact.kafka.handlers.fetch import AGENT_CODECS
    from logcompact.kafka.listeners import parse_listeners
    from logcompact.kafka.server import AgentSettings, run_agent
    from logcompact.kafka.tls import ClientAuth, TlsSettings

    try:
        settings = AgentSettings(
            parse_listeners(listen or ("127.0.0.1:9092",), advertise), allow_insecure_listener, node_id, rack,
            sasl_mechanisms=parse_mechanisms(sasl_mechanisms), flush_interval_ms=flush_ms, flush_bytes=flush_bytes, max_message_bytes=max_message_bytes,
            fetch_cache_bytes=fetch_cache_bytes, fetch_block_cache_bytes=fetch_block_cache_bytes, fetch_compression=AGENT_CODECS[fetch_compression],
            auto_create_topics=auto_create_topics, num_partitions=num_partitions,
            group_max_size=group_max_size, group_max_bytes=group_max_bytes, offsets_commit_timeout_ms=offsets_commit_timeout_ms,
            offsets_retention_ms=offsets_retention_minutes * 60_000, offsets_retention_check_interval_ms=offsets_retention_check_interval_ms,
            max_connections=max_connections, max_connections_per_ip=max_connections_per_ip,
            connections_max_idle_ms=connections_max_idle_ms, connection_setup_timeout_ms=connection_setup_timeout_ms,
            request_read_timeout_ms=request_read_timeout_ms, transaction_max_timeout_ms=transaction_max_timeout_ms,
            transactional_id_expiration_ms=transactional_id_expiration_ms,
            transaction_abort_timed_out_transaction_cleanup_interval_ms=transaction_abort_timed_out_transaction_cleanup_interval_ms,
            transaction_remove_expired_transaction_cleanup_interval_ms=transaction_remove_expired_transaction_cleanup_interval_ms,
            tls=TlsSettings(ssl_certfile, ssl_keyfile, os.environ.get(SSL_KEY_PASSWORD_ENV) or None, ssl_cafile, ClientAuth(ssl_client_auth),
                            ssl_handshake_timeout_ms, ssl_principal_mapping_rules),
            authorization=AuthorizerSettings(authorizer, AuthorizerSettings.parse_super_users(super_users), allow_everyone_if_no_acl_found, acl_refresh_ms),
            metrics_listen=None if metrics_listen is None else Address.parse(metrics_listen, "--metrics-listen"),
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    count = available_cores() if processes is None else processes
    if count > 1:
        try:
            check_processes(settings, count)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--processes") from None
    catalog = ctx.catalog
    if not _cluster_exists(catalog):  # a Kafka quick start's first command: the broker, on empty storage
        cluster_id = catalog.ensure_created(ctx.clock())
        click.echo(f"logcompact: created cluster {cluster_id} in {catalog.store.uri}, which held none (as `logcompact cluster create` does)", err=True)
    if count > 1:
        sys.exit(run_processes(catalog.store.uri, catalog.url, ctx.aws_conn_id, settings, count))
    run_agent(catalog, settings, lambda broker, bound, metrics: emit(listening_line(broker, bound, metrics)))


def listening_line(broker: Broker, bound: dict[str, Address], metrics: Address | None) -> dict[str, Any]:
    """The JSON line an agent prints once it listens: its first listener's address, every listener's, the advertised
    address, node id, cluster id and where /metrics is served (None without --metrics-listen)."""
    return {
        "listening": str(next(iter(bound.values()))), "listeners": {name: str(address) for name, address in bound.items()},
        "advertised": str(broker.advertised), "node_id": broker.node_id, "cluster_id": broker.cluster_id,
        "metrics": None if metrics is None else str(metrics),
    }


def _cluster_exists(catalog: Catalog) -> bool:
    """Whether the store and catalog hold a cluster; a store or catalog of another cluster raises, as every command."""
    try:
        return bool(catalog.cluster_id)
    except ClusterNotFoundError:
        return False
