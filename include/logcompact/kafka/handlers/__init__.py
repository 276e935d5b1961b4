"""The handlers of Kafka's APIs, one module per API family, each `handle(broker, request)` answering every version
of its requests from plain values (`codec.build`): `api_versions`, `metadata` (auto-creating topics through
`topics_admin`), `produce`, `fetch`, `list_offsets`, `init_producer_id`, `find_coordinator`, `groups` (JoinGroup,
SyncGroup, Heartbeat, LeaveGroup, DescribeGroups, ListGroups), `groups_admin` (DeleteGroups, OffsetDelete),
`offsets` (OffsetCommit, OffsetFetch),
`topics_admin` (CreateTopics, DeleteTopics, CreatePartitions), `delete_records` (DeleteRecords), `configs` (DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs), `describe_cluster`, `sasl` (SaslHandshake, SaslAuthenticate outside an authentication), `scram_admin`
(DescribeUserScramCredentials, AlterUserScramCredentials), `transactions` (AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
TxnOffsetCommit), `transactions_admin` (DescribeTransactions, ListTransactions, DescribeProducers, WriteTxnMarkers
for an admin's abort), `acls` (DescribeAcls, CreateAcls, DeleteAcls) and `quotas` (DescribeClientQuotas,
AlterClientQuotas). Each checks what Kafka's KafkaApis checks through `broker.authorizer` first. They import the
broker and the layers below it, and among
themselves only `metadata` → `topics_admin` → `configs`.

Here, the one table of served APIs and their versions (as librdkafka's mock cluster keeps it): requests are
dispatched from it and ApiVersions advertises exactly it. A range kio cannot decode fails at import."""

from __future__ import annotations

from logcompact.kafka.broker import Api
from logcompact.kafka.handlers import (
    acls,
    api_versions,
    configs,
    delete_records,
    describe_cluster,
    fetch,
    find_coordinator,
    groups,
    groups_admin,
    init_producer_id,
    list_offsets,
    metadata,
    offsets,
    produce,
    quotas,
    sasl,
    scram_admin,
    topics_admin,
    transactions,
    transactions_admin,
)

APIS: dict[int, Api] = {
    api.key: api
    for api in (
        Api(api_versions.API_KEY, 0, 4, api_versions.handle),
        Api(metadata.API_KEY, 0, 12, metadata.handle),
        Api(produce.API_KEY, 3, 9, produce.handle),
        Api(fetch.API_KEY, 4, 12, fetch.handle),
        Api(list_offsets.API_KEY, 0, 7, list_offsets.handle),
        Api(find_coordinator.API_KEY, 0, 4, find_coordinator.handle),
        Api(groups.JOIN_GROUP, 0, 9, groups.join_group),
        Api(groups.SYNC_GROUP, 0, 5, groups.sync_group),
        Api(groups.HEARTBEAT, 0, 4, groups.heartbeat),
        Api(groups.LEAVE_GROUP, 0, 5, groups.leave_group),
        Api(groups.DESCRIBE_GROUPS, 0, 5, groups.describe_groups),
        Api(groups.LIST_GROUPS, 0, 4, groups.list_groups),
        Api(groups_admin.DELETE_GROUPS, 0, 2, groups_admin.delete_groups),
        Api(groups_admin.OFFSET_DELETE, 0, 0, groups_admin.offset_delete),
        Api(offsets.OFFSET_COMMIT, 0, 8, offsets.offset_commit),
        Api(offsets.OFFSET_FETCH, 0, 8, offsets.offset_fetch),
        Api(describe_cluster.API_KEY, 0, 1, describe_cluster.handle),
        Api(init_producer_id.API_KEY, 0, 4, init_producer_id.handle),
        Api(transactions.ADD_PARTITIONS_TO_TXN, 0, 3, transactions.add_partitions_to_txn),
        Api(transactions.ADD_OFFSETS_TO_TXN, 0, 3, transactions.add_offsets_to_txn),
        Api(transactions.END_TXN, 0, 3, transactions.end_txn),
        Api(transactions.TXN_OFFSET_COMMIT, 0, 3, transactions.txn_offset_commit),
        Api(transactions_admin.DESCRIBE_TRANSACTIONS, 0, 0, transactions_admin.describe_transactions),
        Api(transactions_admin.LIST_TRANSACTIONS, 0, 1, transactions_admin.list_transactions),
        Api(transactions_admin.DESCRIBE_PRODUCERS, 0, 0, transactions_admin.describe_producers),
        Api(transactions_admin.WRITE_TXN_MARKERS, 1, 1, transactions_admin.write_txn_markers),
        Api(topics_admin.CREATE_TOPICS, 0, 7, topics_admin.create_topics),
        Api(topics_admin.DELETE_TOPICS, 0, 6, topics_admin.delete_topics),
        Api(topics_admin.CREATE_PARTITIONS, 0, 3, topics_admin.create_partitions),
        Api(delete_records.API_KEY, 0, 2, delete_records.handle),
        Api(configs.DESCRIBE_CONFIGS, 0, 4, configs.describe_configs),
        Api(configs.ALTER_CONFIGS, 0, 2, configs.alter_configs),
        Api(configs.INCREMENTAL_ALTER_CONFIGS, 0, 1, configs.incremental_alter_configs),
        Api(sasl.SASL_HANDSHAKE, 0, 1, sasl.sasl_handshake),
        Api(sasl.SASL_AUTHENTICATE, 0, 2, sasl.sasl_authenticate),
        Api(scram_admin.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, 0, scram_admin.describe_user_scram_credentials),
        Api(scram_admin.ALTER_USER_SCRAM_CREDENTIALS, 0, 0, scram_admin.alter_user_scram_credentials),
        Api(acls.DESCRIBE_ACLS, 0, 3, acls.describe_acls),
        Api(acls.CREATE_ACLS, 0, 3, acls.create_acls),
        Api(acls.DELETE_ACLS, 0, 3, acls.delete_acls),
        Api(quotas.DESCRIBE_CLIENT_QUOTAS, 0, 1, quotas.describe_client_quotas),
        Api(quotas.ALTER_CLIENT_QUOTAS, 0, 1, quotas.alter_client_quotas),
    )
}
