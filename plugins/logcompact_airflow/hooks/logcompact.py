"""A logcompact cluster from an Airflow connection: its object store, and the database of its catalog.

The connection's extra names the store; anything of the connection type goes:

    {"conn_type": "generic", "extra": {"store": "file:///var/lib/logcompact"}}
    {"conn_type": "aws", "login": "KEY", "password": "SECRET",
     "extra": {"store": "s3://bucket/prefix", "endpoint_url": "http://127.0.0.1:9000", "region_name": "us-east-1",
               "catalog_conn_id": "logcompact_catalog"}}

An `s3://` store gets its client from the Amazon provider's AWS connection: this connection when it is of
type `aws`, or the one named by the extra `aws_conn_id`. Spark jobs reach the store by its URI alone: on a
cluster, give the workers S3 credentials and `AWS_ENDPOINT_URL` the way Spark jobs usually get them. They
never need the catalog: plans and results pass through the store.

The catalog database is named by one of the extra's keys:

- `catalog`: a SQLAlchemy URL, `postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB` or `sqlite:////path/catalog.db`;
- `catalog_conn_id`: the id of an Airflow `postgres` connection (host, port, login, password, and the
  database as its `schema`), so the password lives in a connection rather than in this extra.

Without either, a `file://` store keeps its catalog in the SQLite file `catalog.db` beside its data; an
`s3://` store needs one (`CatalogConfigError` says so). The catalog URL's password is never printed: messages show
the URL masked (`logcompact.catalog.database.redact_url`), and the hook hands the password (and what may be pieces of
it) to Airflow's secrets masker, which masks it in the task's log whatever prints it.

The extra's `planner` sets the planner's knobs for every DAG on this connection (`PlannerConfig`'s fields,
checked as the planner checks them), e.g. groups of 8 MiB so that a small cluster's plans run as several
Spark jobs: `"planner": {"group_bytes": 8388608, "min_files": [16, 32, 32, 32]}`.
"""

from __future__ import annotations

from dataclasses import fields

from airflow.sdk import BaseHook
from airflow.sdk.log import mask_secret
from sqlalchemy.engine import URL

from logcompact.catalog import Catalog
from logcompact.catalog.database import url_secrets
from logcompact.exceptions import CatalogConfigError, InvalidPlanError
from logcompact.planner import PlannerConfig
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
        return self._open_store(self.get_connection(self.logcompact_conn_id))

    def get_catalog(self) -> Catalog:
        conn = self.get_connection(self.logcompact_conn_id)
        url = self._catalog_url(conn.extra_dejson)
        if url:
            for secret in url_secrets(url):  # before anything may print it
                mask_secret(secret)
        return Catalog(self._open_store(conn), url)

    def get_planner_config(self) -> PlannerConfig:
        """The planner's settings: the defaults, with those the extra's `planner` gives."""
        settings = self.get_connection(self.logcompact_conn_id).extra_dejson.get("planner") or {}
        where = f"connection {self.logcompact_conn_id!r}: extra planner"
        if not isinstance(settings, dict):
            raise ValueError(f'{where} must be an object such as {{"group_bytes": 8388608}}, not {settings!r}')
        allowed = [f.name for f in fields(PlannerConfig)]
        for name in settings:
            if name not in allowed:
                raise ValueError(f"{where} has no setting {name!r}; the settings are {', '.join(allowed)}")
        try:
            return PlannerConfig(**settings)
        except InvalidPlanError as exc:
            raise InvalidPlanError(f"{where}: {exc}") from None

    def _open_store(self, conn) -> ObjectStore:
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
        return open_store(uri, aws_conn_id=aws_conn_id)

    def _catalog_url(self, extra: dict) -> str | None:
        """The catalog URL the extra names, None for the store's embedded default."""
        url, catalog_conn_id = extra.get("catalog"), extra.get("catalog_conn_id")
        if url and not isinstance(url, str):  # (its value is not printed: it may hold a password)
            raise CatalogConfigError(
                f"connection {self.logcompact_conn_id!r}: extra catalog must be a URL string such as "
                f"postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB, not a {type(url).__name__}"
            )
        if url and catalog_conn_id:
            raise CatalogConfigError(
                f"connection {self.logcompact_conn_id!r} names its catalog twice (catalog and catalog_conn_id); keep one"
            )
        if catalog_conn_id:
            return self._postgres_url(catalog_conn_id)
        return url or None

    def _postgres_url(self, conn_id: str) -> str:
        """`postgresql+psycopg://login:password@host:port/schema` of an Airflow `postgres` connection."""
        conn = self.get_connection(conn_id)
        if conn.conn_type != "postgres":
            raise CatalogConfigError(
                f"connection {conn_id!r} (catalog_conn_id of {self.logcompact_conn_id!r}) is of type {conn.conn_type!r}; "
                "make it a postgres connection"
            )
        if not conn.host or not conn.schema:
            raise CatalogConfigError(
                f"connection {conn_id!r} (catalog_conn_id of {self.logcompact_conn_id!r}) needs a host and, as its "
                "schema, the catalog's database; set both"
            )
        # URL.create quotes what the URL syntax reserves (a password with '@' or '/' stays one password).
        return URL.create(
            "postgresql+psycopg", username=conn.login or None, password=conn.password or None,
            host=conn.host, port=conn.port or None, database=conn.schema,
        ).render_as_string(hide_password=False)
