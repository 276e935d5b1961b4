"""What every handler shares: the catalog and this agent's identity in the cluster it serves."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from logcompact.catalog import Catalog

if TYPE_CHECKING:
    from logcompact.kafka.apis import Api


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @staticmethod
    def parse(text: str, option: str) -> Address:
        """HOST:PORT ([IPv6]:PORT); ValueError naming `option` otherwise."""
        host, sep, port = text.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"{option} {text!r} is not HOST:PORT with a port of 0 to 65535 (for example 127.0.0.1:9092)")
        return Address(host, int(port))


@dataclass(frozen=True)
class Broker:
    """This agent as the clients see it: one broker that leads every partition and coordinates the cluster."""

    catalog: Catalog
    cluster_id: str
    node_id: int
    advertised: Address
    apis: Mapping[int, Api] = field(repr=False)

    def topic_id(self, topic: str) -> uuid.UUID:
        """Kafka's topic id (Metadata v10 on): the catalog numbers topics, so derive a UUID stable per cluster."""
        return uuid.uuid5(uuid.UUID(self.cluster_id), topic)

    def serves(self, api_key: int, version: int) -> bool:
        api = self.apis.get(api_key)
        return api is not None and api.min_version <= version <= api.max_version

    def describe(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "host": self.advertised.host, "port": self.advertised.port, "rack": None}
