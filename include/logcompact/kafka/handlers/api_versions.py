"""ApiVersions (key 18): the versions served, read from the handler table so only what is served is advertised."""

from __future__ import annotations

from typing import Any

from logcompact.kafka import codec
from logcompact.kafka.broker import Broker

API_KEY = 18


async def handle(broker: Broker, request: codec.Request) -> Any:
    return _response(broker, request.api_version, codec.ErrorCode.none)


def unsupported(broker: Broker) -> Any:
    """The answer to a request whose API or version is not served: ApiVersions v0 with UNSUPPORTED_VERSION and
    the served ranges, as Kafka answers a client whose ApiVersions is newer than the broker's (the client then
    retries with a version both know). Sent for every unserved request, its first field is the error code."""
    return _response(broker, 0, codec.ErrorCode.unsupported_version)


def _response(broker: Broker, version: int, error: codec.ErrorCode) -> Any:
    ranges = [
        {"api_key": api.key, "min_version": api.min_version, "max_version": api.max_version}
        for api in sorted(broker.apis.values(), key=lambda api: api.key)
    ]
    return codec.build(codec.response_class(API_KEY, version), {"error_code": error, "api_keys": ranges, "throttle_time": 0})
