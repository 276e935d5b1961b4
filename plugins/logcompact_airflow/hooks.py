"""A logcompact store from an Airflow connection.

The connection's extra names the store; anything of the connection type goes:

    {"conn_type": "generic", "extra": {"store": "file:///var/lib/logcompact"}}
    {"conn_type": "aws", "login": "KEY", "password": "SECRET",
     "extra": {"store": "s3://bucket/prefix", "endpoint_url": "http://127.0.0.1:9000", "region_name": "us-east-1"}}

An `s3://` store gets its client from the Amazon provider's AWS connection: this connection when it is of
type `aws`, or the one named by the extra `aws_conn_id`. Spark jobs reach the store by its URI alone: on a
cluster, give the workers S3 credentials and `AWS_ENDPOINT_URL` the way Spark jobs usually get them.
"""

from __future__ import annotations

from airflow.sdk import BaseHook

from logcompact.catalog import Catalog
from logcompact.store import ObjectStore, open_store


class LogcompactHook(BaseHook):
    conn_name_attr = "logcompact_conn_id"
    default_conn_name = "logcompact_default"
    conn_type = "generic"
    hook_name = "logcompact store"

    def __init__(self, logcompact_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.logcompact_conn_id = logcompact_conn_id

    def get_store(self) -> ObjectStore:
        uri, aws_conn_id = self._settings()
        return open_store(uri, aws_conn_id=aws_conn_id)

    def get_catalog(self) -> Catalog:
        return Catalog(self.get_store())

    def _settings(self) -> tuple[str, str | None]:
        conn = self.get_connection(self.logcompact_conn_id)
        extra = conn.extra_dejson
        uri = extra.get("store")
        if not uri:
            raise ValueError(
                f"connection {self.logcompact_conn_id!r} has no store; set its extra to "
                '{"store": "file:///path"} or {"store": "s3://bucket/prefix"}'
            )
        aws_conn_id = None
        if uri.startswith("s3://"):
            aws_conn_id = extra.get("aws_conn_id") or (self.logcompact_conn_id if conn.conn_type == "aws" else None)
        return uri, aws_conn_id
