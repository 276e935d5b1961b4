"""SASL authentication of one connection on a SASL listener, as Kafka's `SaslServerAuthenticator`: before it
completes, a connection may send ApiVersions (once, before SaslHandshake), SaslHandshake v1 and SaslAuthenticate
only, and the server reads each request only after this has answered the one before (server.py), so nothing a client
pipelines runs while its credential is looked up. Anything else closes the connection without an answer (Kafka
answers a request other than SaslAuthenticate after the handshake with that request's ILLEGAL_SASL_STATE error
before closing; the agent only closes). After SaslHandshake v0 the exchange is Kafka's unframed one (aiokafka's
first connection sends v0, before it has asked for the versions): bare size-prefixed tokens each way, and a failure
closes the connection without an answer, as in Kafka.

Mechanisms: PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802/7677, as Kafka's `ScramSaslServer` and
`ScramMessages` take them: gs2 header `n` only, an authzid only if it names the user, extensions ignored but
`tokenauth=true` refused since the agent holds no delegation tokens, no SASLprep). PLAIN is checked against the
user's SCRAM credential (SCRAM-SHA-512 if stored, else SCRAM-SHA-256), so a user has one secret. Credentials are
read from the catalog for every authentication (off the event loop): a removed user opens no new connection.

A failure is answered (when Kafka answers it) after `failed_authentication_delay_ms` (Kafka's
connection.failed.authentication.delay.ms), then the connection closes. Log lines name the mechanism, the user
attempted and the peer, never a password, salted password, key or exchanged message."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from logcompact.catalog.credentials import HASHES, ScramCredential, password_matches
from logcompact.exceptions import LogcompactError
from logcompact.kafka import codec
from logcompact.kafka.broker import Broker
from logcompact.kafka.handlers import api_versions, sasl
from logcompact.kafka.listeners import Listener, SecurityProtocol, is_loopback
from logcompact.kafka.session import KafkaPrincipal

log = logging.getLogger(__name__)

PLAIN = "PLAIN"
MECHANISMS = (PLAIN, *HASHES)  # what --sasl-mechanisms may name
DEFAULT_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")  # the agent's sasl.enabled.mechanisms
DEFAULT_FAILED_AUTHENTICATION_DELAY_MS = 100  # Kafka's connection.failed.authentication.delay.ms
MAX_RECEIVE_BYTES = 524_288  # Kafka's sasl.server.max.receive.size: the largest frame before authentication


def parse_mechanisms(text: str) -> tuple[str, ...]:
    """`--sasl-mechanisms`: comma-separated names (Kafka's sasl.enabled.mechanisms); ValueError naming the option."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise ValueError(f"--sasl-mechanisms {text!r} names no mechanism; give one or more of {', '.join(MECHANISMS)}, comma-separated")
    for name in names:
        if name not in MECHANISMS:
            raise ValueError(f"--sasl-mechanisms: {name!r} is not a mechanism the agent serves; use {', '.join(MECHANISMS)}, comma-separated")
    return tuple(dict.fromkeys(names))


def check_mechanisms(mechanisms: Sequence[str], listeners: Sequence[Listener], allow_insecure_listener: bool) -> None:
    """PLAIN sends passwords as they are: on SASL_PLAINTEXT off loopback only with --allow-insecure-listener."""
    for name in mechanisms:
        if name not in MECHANISMS:
            raise ValueError(f"--sasl-mechanisms: {name!r} is not a mechanism the agent serves; use {', '.join(MECHANISMS)}, comma-separated")
    if PLAIN not in mechanisms or allow_insecure_listener:
        return
    for listener in listeners:
        if listener.protocol == SecurityProtocol.SASL_PLAINTEXT and not is_loopback(listener.address.host):
            raise ValueError(f"--sasl-mechanisms PLAIN on {listener} would send passwords in the clear; "
                             "listen on SASL_SSL, drop PLAIN, or pass --allow-insecure-listener")


class AuthenticationFailed(Exception):
    """A failed exchange: `answer` is the message the client is sent (naming no secret, Kafka's), `reason` what the
    log says (naming no secret either)."""

    def __init__(self, answer: str, reason: str) -> None:
        super().__init__(reason)
        self.answer = answer
        self.reason = reason


def invalid_credentials(mechanism: str, reason: str) -> AuthenticationFailed:
    # Kafka's answer to every SaslException, which says nothing of whether the user exists
    return AuthenticationFailed(f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}", reason)


# Kafka's ScramMessages patterns, `[\x01-\x7F&&[^=,]]` and the like written out for Python
_SAFE = r"\x01-\x2b\x2d-\x3c\x3e-\x7f"  # \x01-\x7F but ',' and '='
_SASLNAME = rf"(?:[{_SAFE}]|=2C|=3D)+"
_VALUE = r"[\x01-\x2b\x2d-\x7f]+"  # \x01-\x7F but ','
_PRINTABLE = r"[\x21-\x2b\x2d-\x7e]+"  # \x21-\x7E but ','
_BASE64 = r"(?:[a-zA-Z0-9/+]{4})*(?:[a-zA-Z0-9/+]{3}=|[a-zA-Z0-9/+]{2}==)?"
_EXTENSIONS = rf"(?:,[A-Za-z]+={_VALUE})*"
_CLIENT_FIRST = re.compile(
    rf"(?P<gs2>n,(?:a=(?P<authzid>{_SASLNAME}))?,)(?P<bare>(?:m={_VALUE},)?n=(?P<saslname>{_SASLNAME}),r=(?P<nonce>{_PRINTABLE})(?P<extensions>{_EXTENSIONS}))"
)
_CLIENT_FINAL = re.compile(rf"(?P<without_proof>c=(?P<channel>{_BASE64}),r=(?P<nonce>{_PRINTABLE}){_EXTENSIONS}),p=(?P<proof>{_BASE64})")


def _sasl_name(escaped: str) -> str:
    return escaped.replace("=2C", ",").replace("=3D", "=")


class ScramExchange:
    """The server's side of one SCRAM exchange: `client_first` (then look the user's credential up),
    `server_first`, `client_final`. Every error is AuthenticationFailed."""

    def __init__(self, mechanism: str) -> None:
        self.mechanism = mechanism
        self._hash = HASHES[mechanism]
        self.user_name = ""
        self._gs2 = self._client_first_bare = self._server_first = self._nonce = ""
        self._credential: ScramCredential | None = None

    def client_first(self, message: bytes) -> str:
        """The user the client names (whose credential `server_first` needs)."""
        match = _CLIENT_FIRST.fullmatch(_text(message, self.mechanism))
        if match is None:  # channel binding asked for (gs2 flag y or p=) or a malformed message
            raise invalid_credentials(self.mechanism, "its client-first message is not one Kafka takes (gs2 header other than 'n', or malformed)")
        self.user_name = _sasl_name(match["saslname"])
        extensions = dict(item.split("=", 1) for item in match["extensions"].split(",")[1:])
        if extensions.get("tokenauth", "").lower() == "true":
            raise invalid_credentials(self.mechanism, "it asked for delegation token authentication (tokenauth), which the agent does not serve")
        authzid = match["authzid"]
        if authzid is not None and _sasl_name(authzid) != self.user_name:
            raise AuthenticationFailed("Authentication failed: Client requested an authorization id that is different from username",
                                       "its authorization id differs from its user name")
        self._gs2, self._client_first_bare, self._nonce = match["gs2"], match["bare"], match["nonce"]
        return self.user_name

    def server_first(self, credential: ScramCredential | None) -> bytes:
        if credential is None:
            raise invalid_credentials(self.mechanism, f"no {self.mechanism} credential is stored for the user")
        self._credential = credential
        self._nonce += secrets.token_urlsafe(24)
        self._server_first = f"r={self._nonce},s={base64.b64encode(credential.salt).decode()},i={credential.iterations}"
        return self._server_first.encode()

    def client_final(self, message: bytes) -> bytes:
        """The server-final message once the client's proof is checked."""
        credential = self._credential
        assert credential is not None, "server_first() first"
        match = _CLIENT_FINAL.fullmatch(_text(message, self.mechanism))
        if match is None:
            raise invalid_credentials(self.mechanism, "its client-final message is malformed")
        # Kafka's check: the nonce ends with the exchange's (librdkafka 2.0, Debian's kcat's, repeats the client's nonce before it)
        if not match["nonce"].endswith(self._nonce):
            raise invalid_credentials(self.mechanism, "its client-final message's nonce is not the exchange's")
        if base64.b64decode(match["channel"]) != self._gs2.encode():
            raise invalid_credentials(self.mechanism, "its client-final message's channel binding is not its gs2 header")
        auth_message = f"{self._client_first_bare},{self._server_first},{match['without_proof']}".encode()
        client_signature = hmac.digest(credential.stored_key, auth_message, self._hash)
        proof = base64.b64decode(match["proof"])
        if len(proof) != len(client_signature):
            raise invalid_credentials(self.mechanism, "its proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
        if not hmac.compare_digest(hashlib.new(self._hash, client_key).digest(), credential.stored_key):
            raise invalid_credentials(self.mechanism, "its proof does not match the stored credential (a wrong password)")
        server_signature = hmac.digest(credential.server_key, auth_message, self._hash)
        return b"v=" + base64.b64encode(server_signature)


def _text(message: bytes, mechanism: str) -> str:
    try:
        return message.decode()
    except UnicodeDecodeError:
        raise invalid_credentials(mechanism, "its message is not UTF-8") from None


def plain_credentials(message: bytes) -> tuple[str, str]:
    """RFC 4616's `authzid NUL authcid NUL passwd`, checked as Kafka's PlainSaslServer: (user name, password)."""
    try:
        tokens = message.decode().split("\0")
    except UnicodeDecodeError:
        raise AuthenticationFailed("Authentication failed: Invalid username or password", "its PLAIN message is not UTF-8") from None
    if len(tokens) != 3:
        raise AuthenticationFailed(f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(tokens)}", "its PLAIN message is malformed")
    authzid, user_name, password = tokens
    if not user_name:
        raise AuthenticationFailed("Authentication failed: username not specified", "its PLAIN message names no user")
    if not password:
        raise AuthenticationFailed("Authentication failed: password not specified", "its PLAIN message has no password")
    if authzid and authzid != user_name:
        raise AuthenticationFailed("Authentication failed: Client requested an authorization id that is different from username",
                                   "its authorization id differs from its user name")
    return user_name, password


@dataclass
class SaslAuthenticator:
    """One connection's authentication: `answer` takes each request (each bare token once `unframed`) read before it
    completes (`principal` set) or fails (`failed`: the connection closes once the answer, if any, is written)."""

    broker: Broker
    mechanisms: tuple[str, ...]
    failed_authentication_delay_ms: int
    peer: str
    versions_answered: bool = False
    mechanism: str | None = None  # chosen by SaslHandshake
    unframed: bool = False  # SaslHandshake v0: tokens follow without Kafka's request and response headers
    principal: KafkaPrincipal | None = None
    failed: bool = False
    _failure: str = ""  # the message of the failure, for the client
    _scram: ScramExchange | None = None

    async def answer(self, received: codec.Request | bytes) -> bytes | None:
        """The frame answering what was read before authentication completed, None for a close without one."""
        if isinstance(received, bytes):
            token = await self._token(received)
            return None if token is None else len(token).to_bytes(4, "big") + token
        response = await self._response(received)
        return None if response is None else codec.encode_response(received.correlation_id, response)

    async def _response(self, request: codec.Request) -> Any | None:
        api, version = request.api_key, request.api_version
        if api == api_versions.API_KEY and self.mechanism is None and not self.versions_answered:
            if request.body is None:  # a newer ApiVersions: answered with the served ranges, and may be sent again
                return api_versions.unsupported(self.broker)
            self.versions_answered = True
            return await api_versions.handle(self.broker, request)
        if api == sasl.SASL_HANDSHAKE and self.mechanism is None and request.body is not None:
            return await self._handshake(request)
        if api == sasl.SASL_AUTHENTICATE and self.mechanism is not None and request.body is not None:
            token = await self._token(request.body.auth_bytes)
            if token is None:
                return sasl.authenticate_response(request.api_version, codec.ErrorCode.sasl_authentication_failed, self._failure)
            return sasl.authenticate_response(request.api_version, codec.ErrorCode.none, None, token)
        during = "SASL authentication" if self.mechanism is not None else "SASL handshake"
        await self._close(f"it sent {codec.api_name(api)} v{version} during {during}, where Kafka takes "
                          f"{'SaslAuthenticate' if self.mechanism else 'ApiVersions (once) and SaslHandshake'} only")
        return None

    async def _close(self, reason: str) -> None:
        log.warning("connection from %s closed before authenticating: %s", self.peer, reason)
        await self._fail()

    async def _fail(self) -> None:
        self.failed = True
        await asyncio.sleep(self.failed_authentication_delay_ms / 1000)

    async def _handshake(self, request: codec.Request) -> Any:
        asked = request.body.mechanism
        if asked not in self.mechanisms:
            log.info("connection from %s closed: it asked for SASL mechanism %r, not one enabled (%s)", self.peer, asked, ", ".join(self.mechanisms))
            await self._fail()
            return sasl.handshake_response(request.api_version, codec.ErrorCode.unsupported_sasl_mechanism, self.mechanisms)
        self.mechanism = asked
        self.unframed = request.api_version == 0
        if asked != PLAIN:
            self._scram = ScramExchange(asked)
        return sasl.handshake_response(request.api_version, codec.ErrorCode.none, self.mechanisms)

    async def _token(self, token: bytes) -> bytes | None:
        """The mechanism's answer to the client's token, None when authentication failed (`_failure` says why, to
        the client in a framed exchange; an unframed one is closed without a word, as in Kafka)."""
        mechanism = self.mechanism
        assert mechanism is not None
        user_name: str | None = None
        try:
            if self._scram is None:
                user_name, password = plain_credentials(token)
                credential = await self._credential(user_name, mechanism)
                if credential is None or not await asyncio.to_thread(password_matches, credential, password):
                    raise AuthenticationFailed("Authentication failed: Invalid username or password",
                                               "no credential is stored for the user" if credential is None else "a wrong password")
                self.principal = KafkaPrincipal("User", user_name)
                answer = b""
            elif not self._scram.user_name:
                user_name = self._scram.client_first(token)
                answer = self._scram.server_first(await self._credential(user_name, mechanism))
            else:
                user_name = self._scram.user_name
                answer = self._scram.client_final(token)
                self.principal = KafkaPrincipal("User", user_name)
        except AuthenticationFailed as exc:
            attempted = "an unnamed user" if user_name is None else f"User:{user_name}"
            log.info("SASL %s authentication of %s from %s failed: %s", mechanism, attempted, self.peer, exc.reason)
            self._failure = exc.answer
            await self._fail()
            return None
        if self.principal is not None:
            log.debug("connection from %s authenticated as %s (SASL %s%s)", self.peer, self.principal, mechanism,
                      ", unframed after SaslHandshake v0" if self.unframed else "")
        return answer

    async def _credential(self, user_name: str, mechanism: str) -> ScramCredential | None:
        catalog = self.broker.catalog
        try:
            if mechanism == PLAIN:
                return await asyncio.to_thread(catalog.password_credential, user_name)
            return await asyncio.to_thread(catalog.scram_credential, user_name, mechanism)
        except LogcompactError as exc:  # Kafka: "Credentials could not be obtained", answered as invalid credentials
            log.warning("SASL %s authentication of User:%s from %s: its credential could not be read from the catalog: %s",
                        mechanism, user_name, self.peer, exc)
            raise invalid_credentials(mechanism, "its credential could not be read") from None
