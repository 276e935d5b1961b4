"""Kafka's listeners: each a security protocol on an address, named after its protocol (Kafka's `listeners` with
its default `listener.security.protocol.map`), and where clients are told to reach it (`advertised.listeners`)."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from logcompact.kafka.cluster import Address


class SecurityProtocol(StrEnum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def uses_tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


@dataclass(frozen=True)
class Listener:
    protocol: SecurityProtocol
    address: Address
    advertise: Address | None = None  # the bound address when None

    @property
    def name(self) -> str:
        return self.protocol.value

    def __str__(self) -> str:
        return f"{self.name}://{self.address}"


def parse_endpoint(text: str, option: str) -> tuple[SecurityProtocol, Address]:
    """`PROTOCOL://HOST:PORT`, or `HOST:PORT` for PLAINTEXT; ValueError naming `option` otherwise."""
    protocol_name, sep, address = text.rpartition("://")
    if not sep:
        return SecurityProtocol.PLAINTEXT, Address.parse(text, option)
    try:
        protocol = SecurityProtocol(protocol_name.upper())
    except ValueError:
        raise ValueError(
            f"{option} {text!r}: {protocol_name!r} is not a security protocol; use one of {', '.join(p.value for p in SecurityProtocol)}"
        ) from None
    return protocol, Address.parse(address, option)


def parse_listeners(listen: Sequence[str], advertise: Sequence[str]) -> tuple[Listener, ...]:
    """The listeners of `--listen` (each protocol once) with their `--advertise` addresses (each naming a listener's
    protocol); ValueError naming the option otherwise."""
    listeners: dict[SecurityProtocol, Address] = {}
    for text in listen:
        protocol, address = parse_endpoint(text, "--listen")
        if protocol in listeners:
            raise ValueError(f"--listen {text!r}: a {protocol} listener is given twice; each protocol names one listener")
        listeners[protocol] = address
    advertised: dict[SecurityProtocol, Address] = {}
    for text in advertise:
        protocol, address = parse_endpoint(text, "--advertise")
        if protocol not in listeners:
            raise ValueError(f"--advertise {text!r}: no {protocol} listener is given; add --listen {protocol}://HOST:PORT or advertise a listener's protocol")
        if protocol in advertised:
            raise ValueError(f"--advertise {text!r}: the {protocol} listener is advertised twice")
        advertised[protocol] = address
    return tuple(Listener(protocol, address, advertised.get(protocol)) for protocol, address in listeners.items())


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine only: 127.0.0.0/8, ::1 or localhost (0.0.0.0 and names are the network)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def insecure(listeners: Sequence[Listener], plain_passwords: bool = False) -> list[Listener]:
    """The listeners that carry records in the clear off loopback: PLAINTEXT ones on another address, and SASL_PLAINTEXT
    ones when PLAIN is enabled (`plain_passwords`: passwords in the clear too)."""
    clear = (SecurityProtocol.PLAINTEXT, SecurityProtocol.SASL_PLAINTEXT) if plain_passwords else (SecurityProtocol.PLAINTEXT,)
    return [listener for listener in listeners if listener.protocol in clear and not is_loopback(listener.address.host)]


def check_insecure(listeners: Sequence[Listener], allowed: bool) -> None:
    """ValueError naming the first insecure listener and the fix, unless `allowed` (--allow-insecure-listener)."""
    if not allowed and (found := insecure(listeners)):
        raise ValueError(
            f"--listen {found[0]}: a PLAINTEXT listener off loopback sends records in the clear to anyone on the network; "
            "listen on 127.0.0.1, use an SSL or SASL_SSL listener, or pass --allow-insecure-listener"
        )
