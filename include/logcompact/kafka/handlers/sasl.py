"""SaslHandshake (key 17) and SaslAuthenticate (key 36): the responses the authenticator (kafka/authenticator.py)
answers with while a connection on a SASL listener authenticates, and the handlers of the table, which see these
requests only outside an authentication (on a listener without SASL, or after it completed) and answer them as
Kafka's KafkaApis does: ILLEGAL_SASL_STATE."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from logcompact.kafka import codec
from logcompact.kafka.broker import Broker

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36


def handshake_response(version: int, error: codec.ErrorCode, mechanisms: Sequence[str]) -> Any:
    return codec.build(codec.response_class(SASL_HANDSHAKE, version), {"error_code": error, "mechanisms": list(mechanisms)})


def authenticate_response(version: int, error: codec.ErrorCode, message: str | None, token: bytes = b"") -> Any:
    # session_lifetime 0: no re-authentication (KIP-368), Kafka's default connections.max.reauth.ms
    return codec.build(codec.response_class(SASL_AUTHENTICATE, version),
                       {"error_code": error, "error_message": message, "auth_bytes": token, "session_lifetime": 0})


async def sasl_handshake(broker: Broker, request: codec.Request) -> Any:
    return handshake_response(request.api_version, codec.ErrorCode.illegal_sasl_state, [])


async def sasl_authenticate(broker: Broker, request: codec.Request) -> Any:
    return authenticate_response(request.api_version, codec.ErrorCode.illegal_sasl_state, "SaslAuthenticate request received after successful authentication")
