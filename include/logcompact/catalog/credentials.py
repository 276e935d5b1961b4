"""Users' SCRAM credentials (`scram_credentials`), as Kafka stores them: per user and mechanism the salt, StoredKey,
ServerKey and iterations (RFC 5802), never the password, so every agent authenticates every user. Not part of the
manifest: each write is a small transaction that creates no version. The formulas are Kafka's `ScramFormatter`
(the password's UTF-8 bytes, no SASLprep: what Kafka's clients and `kafka-configs.sh` salt). Functions of a
Connection, called by `Catalog` inside its transactions.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy import Connection, delete, insert, select

from logcompact.catalog import schema as s

# Kafka's mechanisms with their hash and their code on the wire (its ScramMechanism types; 0 is UNKNOWN)
HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MECHANISM_CODES = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
MIN_ITERATIONS = 4096  # Kafka's ScramMechanism minIterations, for both mechanisms
MAX_ITERATIONS = 16384  # Kafka's ScramControlManager MAX_ITERATIONS
SALT_BYTES = 32


@dataclass(frozen=True)
class ScramCredential:
    mechanism: str
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def __repr__(self) -> str:  # keys stay out of logs and tracebacks
        return f"ScramCredential({self.mechanism}, iterations={self.iterations})"


@dataclass(frozen=True)
class UserMechanism:
    """What `user list` and DescribeUserScramCredentials show of a credential: no salt, no key."""

    user_name: str
    mechanism: str
    iterations: int


def check_mechanism(mechanism: str) -> None:
    if mechanism not in HASHES:
        raise ValueError(f"SCRAM mechanism {mechanism!r} is not one of {', '.join(HASHES)}")


def check_iterations(iterations: int) -> None:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations {iterations} is outside {MIN_ITERATIONS} to {MAX_ITERATIONS} (Kafka's bounds)")


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """RFC 5802's SaltedPassword: Hi(password, salt, i), which is PBKDF2 with the mechanism's HMAC."""
    return hashlib.pbkdf2_hmac(HASHES[mechanism], password.encode(), salt, iterations)


def from_salted_password(mechanism: str, salt: bytes, salted: bytes, iterations: int) -> ScramCredential:
    """The credential stored for a salted password (what a KIP-554 AlterUserScramCredentials sends)."""
    name = HASHES[mechanism]
    client_key = hmac.digest(salted, b"Client Key", name)
    server_key = hmac.digest(salted, b"Server Key", name)
    return ScramCredential(mechanism, salt, hashlib.new(name, client_key).digest(), server_key, iterations)


def new_credential(mechanism: str, password: str, iterations: int) -> ScramCredential:
    """A credential for `password` with a fresh random salt."""
    check_mechanism(mechanism)
    check_iterations(iterations)
    salt = secrets.token_bytes(SALT_BYTES)
    return from_salted_password(mechanism, salt, salted_password(mechanism, password, salt, iterations), iterations)


def password_matches(credential: ScramCredential, password: str) -> bool:
    """Whether `password`, salted with the credential's salt and iterations, gives its StoredKey (compared in
    constant time): how SASL/PLAIN is checked against the SCRAM credential, so a user has one secret."""
    derived = from_salted_password(credential.mechanism, credential.salt,
                                   salted_password(credential.mechanism, password, credential.salt, credential.iterations), credential.iterations)
    return hmac.compare_digest(derived.stored_key, credential.stored_key)


def put(connection: Connection, user_name: str, credential: ScramCredential) -> None:
    """Store the user's credential for its mechanism, replacing the one it had."""
    sc = s.scram_credentials.c
    connection.execute(delete(s.scram_credentials).where(sc.user_name == user_name, sc.mechanism == credential.mechanism))
    connection.execute(insert(s.scram_credentials).values(
        user_name=user_name, mechanism=credential.mechanism, salt=credential.salt, stored_key=credential.stored_key,
        server_key=credential.server_key, iterations=credential.iterations,
    ))


def remove(connection: Connection, user_name: str, mechanism: str | None) -> list[str]:
    """Remove the user's credential for `mechanism` (all of them for None); the mechanisms removed."""
    sc = s.scram_credentials.c
    where = [sc.user_name == user_name] + ([sc.mechanism == mechanism] if mechanism is not None else [])
    removed = sorted(connection.execute(select(sc.mechanism).where(*where)).scalars())
    connection.execute(delete(s.scram_credentials).where(*where))
    return removed


def get(connection: Connection, user_name: str, mechanism: str) -> ScramCredential | None:
    sc = s.scram_credentials.c
    row = connection.execute(select(s.scram_credentials).where(sc.user_name == user_name, sc.mechanism == mechanism)).first()
    return None if row is None else ScramCredential(row.mechanism, row.salt, row.stored_key, row.server_key, row.iterations)


def listed(connection: Connection, user_names: list[str] | None = None) -> list[UserMechanism]:
    """The credentials of `user_names` (every user's for None), by user and mechanism: names and iterations only."""
    sc = s.scram_credentials.c
    query = select(sc.user_name, sc.mechanism, sc.iterations).order_by(sc.user_name, sc.mechanism)
    if user_names is not None:
        query = query.where(sc.user_name.in_(user_names))
    return [UserMechanism(row.user_name, row.mechanism, row.iterations) for row in connection.execute(query)]
