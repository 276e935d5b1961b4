"""`logcompact agent`: a server that speaks Kafka's protocol over the catalog.

Modules, from the bottom up, each importing only the ones listed before it (and the product's layers below the
package: catalog, store, format, ingest, consume, topics):

- `codec`: the wire format, the one module that imports kio.
- `records`: record batches v2, decoded for Produce and encoded for Fetch, the one module that imports
  kafka-python; `NO_LEADER_EPOCH`.
- `cluster`: the agents serving the catalog (`AgentDirectory`: registration, heartbeat, each partition's leader
  and each group's coordinator) and their `Address`.
- `event_loop`: what crosses into the event loop from the catalog and other threads (`CommitWatch`, `LoopResults`).
- `producer_state`: idempotent producers' state and the checks of their batches (`ProducerStateManager`).
- `ingest_thread`: the server's one ingest agent and the thread that feeds it (`Ingest`), which holds the
  producers' state.
- `group_coordinator`: the consumer groups this agent coordinates (`GroupCoordinator`).
- `broker`: the `Broker` every handler is given, and a handler's type (`Handler`, `Api`).
- `handlers`: one module per API family (`api_versions`, `metadata`, `produce`, `fetch`, `list_offsets`,
  `init_producer_id`, `find_coordinator`, `groups`, `offsets`, `topics_admin`, `configs`, `describe_cluster`), and
  in `handlers/__init__.py` the table of handlers and versions that ApiVersions advertises.
- `server`: the asyncio listener and connection loop, and its shutdown.

State lives in the managers named for it (the group coordinator, the producers' state, the agents' directory),
never in a handler. The catalog, ingest and consume never import this package.
"""
