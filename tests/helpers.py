"""Small builders shared by the tests."""

from __future__ import annotations

from logcompact.catalog import Catalog
from logcompact.topics import Topic

NOW = 1_700_000_000_000


def create_topic(catalog: Catalog, name: str, partitions: int = 1, now: int = NOW, **settings: str) -> Topic:
    topic = Topic.create(name, partitions, {k.replace("_", "."): v for k, v in settings.items()}, now)
    catalog.ensure_created(now)
    catalog.commit(f"create topic {name}", lambda m: (m.with_topic(topic), None), now)
    return topic

