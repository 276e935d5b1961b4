"""Throw-away servers on 127.0.0.1 for the tests, the benchmarks and trying logcompact out: a PostgreSQL cluster held
in RAM (`postgres.start_postgres`), a one-node Ceph RADOS Gateway for S3 (`rgw.start_rgw`) and Apache Kafka's own
broker, one KRaft node, as the reference the agent is compared with (`kafka.start_kafka`), each made in a directory of
its own and stopped by its PIDs."""
