"""Who sent a request and how (Kafka's `RequestContext`'s security part): the listener it arrived on, the client's
address and the principal the connection authenticated as. One per connection, replaced when SASL completes; every
decoded request carries its connection's, so handlers and the authorizer read it from the request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KafkaPrincipal:
    """Kafka's principal, `User:NAME` (the only type its authenticators make)."""

    principal_type: str
    name: str

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"

    @staticmethod
    def parse(text: str, option: str) -> KafkaPrincipal:
        """`TYPE:NAME` (Kafka's form); ValueError naming `option` otherwise."""
        principal_type, sep, name = text.partition(":")
        if not sep or not principal_type or not name:
            raise ValueError(f"{option} {text!r} is not a principal TYPE:NAME (for example User:alice)")
        return KafkaPrincipal(principal_type, name)


ANONYMOUS = KafkaPrincipal("User", "ANONYMOUS")  # a connection authenticated by neither TLS nor SASL


@dataclass(frozen=True)
class Session:
    listener: str = "PLAINTEXT"  # the listener's name, which is its security protocol's
    client_host: str = ""  # the peer's address, as ACLs' host rules and per-address quotas match it
    principal: KafkaPrincipal = ANONYMOUS
    authenticated: bool = True  # False on a SASL listener until SaslAuthenticate succeeded


LOCAL = Session(client_host="127.0.0.1")  # requests made in-process (tests, the lab)
