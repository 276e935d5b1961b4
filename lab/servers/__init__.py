"""Throw-away servers on 127.0.0.1 for the tests, the benchmarks and trying logcompact out: a PostgreSQL cluster held
in RAM (`postgres.start_postgres`) and a one-node Ceph RADOS Gateway for S3 (`rgw.start_rgw`), each made in a
directory of its own and stopped by its PIDs."""
