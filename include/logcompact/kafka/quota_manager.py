"""Kafka's client quotas as one agent enforces them: `producer_byte_rate` and `consumer_byte_rate` per user and client
id (Kafka's ClientQuotaManager, KIP-55's precedence), `connection_creation_rate` per client address (Kafka's
ConnectionQuotas).

Rates are measured as Kafka measures them (its `Rate` over a `WindowedSum`): `QUOTA_WINDOW_NUM` samples of
`QUOTA_WINDOW_SIZE_SECONDS` each (Kafka's quota.window.num, 11, and quota.window.size.seconds, 1), the window taken
as at least the samples but one, so a client's first bytes are not measured over a moment. A request that takes the
rate over its quota is answered with Kafka's throttle time, (observed - quota) / quota * window, and the agent reads
nothing more from that connection for that long (KIP-219; `server.py` honours `throttle_ms` of the answer).

Enforced per agent, as Kafka's quotas are per broker: a client talking to three agents may use three times its quota.
The quotas are read from the catalog at start, every `REFRESH_SECONDS`, and right after this agent's own
AlterClientQuotas; a catalog that cannot be read leaves the last quotas standing.

A rate is kept per quota type and per the entity whose quota applies, as Kafka keys its sensors by their metric tags:
clients under one user's quota share one rate, a client id under the default client-id quota has a rate of its own.
Rates not recorded for an hour are dropped (Kafka's sensor expiry). User names are matched as given: Kafka sanitizes
them only to name its metrics.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from logcompact.catalog import Catalog
from logcompact.catalog.quotas import (
    CLIENT_ID,
    CONNECTION_CREATION_RATE,
    CONSUMER_BYTE_RATE,
    IP,
    PRODUCER_BYTE_RATE,
    USER,
    QuotaEntity,
)
from logcompact.kafka.session import Session

log = logging.getLogger(__name__)

QUOTA_WINDOW_NUM = 11  # Kafka's quota.window.num
QUOTA_WINDOW_SIZE_SECONDS = 1  # Kafka's quota.window.size.seconds
REFRESH_SECONDS = 5.0  # how often each agent reads the quotas again: an alteration on another agent applies within it
SENSOR_EXPIRY_MS = 3_600_000  # Kafka's InactiveSensorExpirationTimeSeconds
# Kafka bounds a connection's throttle to one window (ConnectionQuotas' maxThrottleTimeMs).
MAX_CONNECTION_THROTTLE_MS = QUOTA_WINDOW_SIZE_SECONDS * 1000


class _Sample:
    __slots__ = ("value", "start_ms", "last_event_ms")

    def __init__(self, now_ms: float) -> None:
        self.reset(now_ms)

    def reset(self, now_ms: float) -> None:
        self.value = 0.0
        self.start_ms = now_ms
        self.last_event_ms = now_ms


class Rate:
    """Kafka's `Rate` of a `WindowedSum`: values per second over `samples` windows of `window_ms` (and one more
    sample for the window overlapping the oldest)."""

    def __init__(self, samples: int = QUOTA_WINDOW_NUM, window_ms: int = QUOTA_WINDOW_SIZE_SECONDS * 1000) -> None:
        self.samples = samples
        self.window_ms = window_ms
        self._samples: list[_Sample] = []
        self._current = 0
        self.last_record_ms = 0.0

    def record(self, value: float, now_ms: float) -> None:
        sample = self._current_sample(now_ms)
        if now_ms - sample.start_ms >= self.window_ms:
            self._current = (self._current + 1) % (self.samples + 1)
            if self._current >= len(self._samples):
                sample = _Sample(now_ms)
                self._samples.append(sample)
            else:
                sample = self._samples[self._current]
                sample.reset(now_ms)
        sample.value += value
        sample.last_event_ms = now_ms
        self.last_record_ms = now_ms

    def measure(self, now_ms: float) -> float:
        self._purge(now_ms)
        return sum(sample.value for sample in self._samples) / (self.window_size_ms(now_ms) / 1000)

    def window_size_ms(self, now_ms: float) -> float:
        """The time the rate is taken over: since the oldest sample kept, and at least `samples` - 1 windows."""
        self._purge(now_ms)
        oldest = min((sample.start_ms for sample in self._samples), default=now_ms)
        elapsed = now_ms - oldest
        full_windows = int(elapsed // self.window_ms)
        if full_windows < self.samples - 1:
            elapsed += (self.samples - 1 - full_windows) * self.window_ms
        return max(elapsed, 1.0)

    def _current_sample(self, now_ms: float) -> _Sample:
        if not self._samples:
            self._samples.append(_Sample(now_ms))
        return self._samples[self._current]

    def _purge(self, now_ms: float) -> None:
        expire_age = self.samples * self.window_ms
        for sample in self._samples:
            if now_ms - sample.last_event_ms >= expire_age:
                sample.reset(now_ms)


def record_and_throttle_ms(rate: Rate, value: float, quota: float, now_ms: float) -> int:
    """Record `value`, then the throttle time if the rate is over `quota` (Kafka's Sensor.record with its quota
    checked, then QuotaUtils.throttleTime), else 0."""
    rate.record(value, now_ms)
    observed = rate.measure(now_ms)
    if observed <= quota:
        return 0
    return round((observed - quota) / quota * rate.window_size_ms(now_ms))


@dataclass(frozen=True)
class Muted:
    """A request answered with no response (Produce with acks=0) whose connection is throttled all the same: Kafka
    mutes the channel for the throttle time and sends nothing."""

    throttle_ms: int


def remaining_ms(throttle_ms: int, since: float) -> int:
    """What is left, now, of a throttle of `throttle_ms` computed at `since` (time.monotonic())."""
    return max(0, throttle_ms - round((time.monotonic() - since) * 1000)) if throttle_ms else 0


def throttle_ms_of(response: Any) -> int:
    """How long the connection of this answer stops being read: a Muted's time, or the response's throttle_time."""
    if isinstance(response, Muted):
        return response.throttle_ms
    throttle = getattr(response, "throttle_time", None)
    if isinstance(throttle, timedelta):
        return int(throttle / timedelta(milliseconds=1))
    return int(throttle or 0)


_ABSENT = "\0absent"  # an entity part not in the entity (None is the default entity)

# A rate's key: the quota type and Kafka's metric tags (the user, the client id, '' for a part the quota ignores)
RateKey = tuple[str, str, str]


class ClientQuotaManager:
    """The client quotas this agent enforces, cached from the catalog, and the rates it measures."""

    def __init__(self, catalog: Catalog, quotas: Mapping[QuotaEntity, Mapping[str, float]],
                 clock_ms: Callable[[], float] = lambda: time.monotonic() * 1000) -> None:
        self._catalog = catalog
        self._clock_ms = clock_ms
        self._rates: dict[RateKey, Rate] = {}
        self._connection_rates: dict[str, Rate] = {}
        self._refreshing: asyncio.Task | None = None
        self._default_ip_rate: float | None = None
        self.update(quotas)

    @classmethod
    def load(cls, catalog: Catalog) -> ClientQuotaManager:
        """The quotas the catalog holds now (blocking)."""
        return cls(catalog, catalog.client_quotas())

    def update(self, quotas: Mapping[QuotaEntity, Mapping[str, float]]) -> None:
        """Enforce these quotas from now on (the rates measured so far are kept, as Kafka's sensors are)."""
        by_key: dict[str, dict[tuple[tuple[str, str | None], ...], float]] = {}
        ip_rates: dict[Any, float] = {}
        default_ip_rate = None
        for entity, values in quotas.items():
            parts = entity.as_dict()
            for key, value in values.items():
                if key == CONNECTION_CREATION_RATE and IP in parts:
                    name = parts[IP]
                    if name is None:
                        default_ip_rate = value
                    else:
                        ip_rates[ipaddress.ip_address(name)] = value
                else:
                    by_key.setdefault(key, {})[tuple((kind, parts.get(kind, _ABSENT)) for kind in (USER, CLIENT_ID))] = value
        self._quotas = by_key
        self._ip_rates = ip_rates
        self._default_ip_rate = default_ip_rate
        self.configured = quotas

    # -- byte rates ------------------------------------------------------------------------------------------

    def quota(self, key: str, user: str, client_id: str) -> tuple[float, RateKey] | None:
        """The quota `key` of this user and client id, and the rate it is measured by; None when no quota applies.
        KIP-55's precedence, as Kafka's DefaultQuotaCallback: the most specific entity that sets `key` wins."""
        quotas = self._quotas.get(key)
        if not quotas:
            return None
        for user_part, client_part, tags in (
            (user, client_id, (user, client_id)),  # /users/<user>/clients/<client-id>
            (user, None, (user, client_id)),  # /users/<user>/clients/<default>
            (user, _ABSENT, (user, "")),  # /users/<user>
            (None, client_id, (user, client_id)),  # /users/<default>/clients/<client-id>
            (None, None, (user, client_id)),  # /users/<default>/clients/<default>
            (None, _ABSENT, (user, "")),  # /users/<default>
            (_ABSENT, client_id, ("", client_id)),  # /clients/<client-id>
            (_ABSENT, None, ("", client_id)),  # /clients/<default>
        ):
            value = quotas.get(((USER, user_part), (CLIENT_ID, client_part)))
            if value is not None:
                return value, (key, *tags)
        return None

    def record(self, key: str, session: Session, client_id: str | None, value: float) -> int:
        """Record `value` (bytes) against the quota `key` of the request's user and client id; the throttle time in
        ms, 0 when within it or under no quota (Kafka's maybeRecordAndGetThrottleTimeMs)."""
        found = self.quota(key, session.principal.name, client_id or "")
        if found is None:
            return 0
        quota, rate_key = found
        rate = self._rates.get(rate_key)
        if rate is None:
            rate = self._rates[rate_key] = Rate()
        return record_and_throttle_ms(rate, value, quota, self._clock_ms())

    def unrecord(self, key: str, session: Session, client_id: str | None, value: float) -> None:
        """Take back a value recorded (a throttled Fetch answers no records: Kafka's unrecordQuotaSensor)."""
        found = self.quota(key, session.principal.name, client_id or "")
        if found is not None and (rate := self._rates.get(found[1])) is not None:
            rate.record(-value, self._clock_ms())

    def max_value_in_window(self, key: str, session: Session, client_id: str | None) -> float | None:
        """The most one request may carry without being throttled for sure, quota * (samples - 1) * window, which
        bounds a Fetch's bytes (Kafka's getMaxValueInQuotaWindow); None under no quota."""
        found = self.quota(key, session.principal.name, client_id or "")
        return None if found is None else found[0] * (QUOTA_WINDOW_NUM - 1) * QUOTA_WINDOW_SIZE_SECONDS

    def record_produce(self, session: Session, client_id: str | None, request_bytes: int) -> int:
        return self.record(PRODUCER_BYTE_RATE, session, client_id, request_bytes)

    def record_fetch(self, session: Session, client_id: str | None, response_bytes: int) -> int:
        return self.record(CONSUMER_BYTE_RATE, session, client_id, response_bytes)

    # -- connection creation per address ---------------------------------------------------------------------

    def connection_rate(self, host: str) -> float | None:
        """The connection_creation_rate of this address: its own, else the default address's; None without."""
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return self._default_ip_rate
        return self._ip_rates.get(address, self._default_ip_rate)

    def record_connection(self, host: str) -> int:
        """A connection from `host` accepted: 0, or the ms to hold it before closing it when it is over the
        address's connection_creation_rate (not counted then: Kafka records it, then takes it back)."""
        quota = self.connection_rate(host)
        if quota is None:
            return 0
        rate = self._connection_rates.get(host)
        if rate is None:
            rate = self._connection_rates[host] = Rate()
        now = self._clock_ms()
        throttle_ms = record_and_throttle_ms(rate, 1.0, quota, now)
        if throttle_ms:
            rate.record(-1.0, now)
        return min(throttle_ms, MAX_CONNECTION_THROTTLE_MS)

    # -- the cache -------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._refreshing = asyncio.create_task(self._refresh_every())

    async def stop(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            await asyncio.gather(self._refreshing, return_exceptions=True)

    async def refresh(self) -> None:
        """Read the quotas from the catalog now; a failure is logged and the last quotas stay."""
        try:
            quotas = await asyncio.to_thread(self._catalog.client_quotas)
        except Exception as exc:  # the catalog down: keep enforcing what was read last; the next refresh tries again
            log.warning("client quotas could not be read from the catalog (the last ones read stay in force): %s", exc)
            return
        self.update(quotas)
        self._expire(self._clock_ms())

    async def _refresh_every(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            await self.refresh()

    def _expire(self, now_ms: float) -> None:
        self._rates = {key: rate for key, rate in self._rates.items() if now_ms - rate.last_record_ms < SENSOR_EXPIRY_MS}
        self._connection_rates = {host: rate for host, rate in self._connection_rates.items() if now_ms - rate.last_record_ms < SENSOR_EXPIRY_MS}

