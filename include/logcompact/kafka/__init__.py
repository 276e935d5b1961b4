"""`logcompact agent`: a server that speaks Kafka's protocol over the catalog.

Layers, each importing only the ones below it: `codec` (the wire format, the one module that imports kio),
`records` (record batches, the one module that imports kafka-python), `broker` (what the handlers share: the
catalog, this agent's node id and address, its ingest agent), one module per API family (`api_versions`,
`metadata`, `produce`, `list_offsets`), `apis` (the table of handlers and versions that ApiVersions advertises)
and `server` (the asyncio connection loop, the listener and its shutdown). The catalog, ingest and
consume never import this package.
"""
