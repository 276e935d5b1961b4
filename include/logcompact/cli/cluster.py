"""`logcompact cluster ...` and `status`: the cluster a store and its catalog belong to, and the cleaner's figures."""

from __future__ import annotations

from pathlib import Path

import click

from logcompact.cli.common import Context, emit, now_option, pass_context
from logcompact.exceptions import ClusterMismatchError, ClusterNotFoundError, CorruptDataError, StaleCatalogError


@click.group()
def cluster() -> None:
    """The cluster a store and its catalog belong to (the store's cluster.json marker)."""


@cluster.command("create")
@now_option
@pass_context
def cluster_create(ctx: Context) -> None:
    """Create an empty cluster in the store and catalog (its schema and version 1), or do nothing if one is there:
    what deployments run once before their first agent, so the agents serve a cluster made on purpose (an agent
    started on an empty store creates one too). Prints the cluster id and whether it was created."""
    catalog = ctx.catalog
    try:
        emit({"cluster_id": catalog.cluster_id, "created": False})
    except ClusterNotFoundError:
        emit({"cluster_id": catalog.ensure_created(ctx.clock()), "created": True})


@cluster.command("describe")
@pass_context
def cluster_describe(ctx: Context) -> None:
    """The cluster id, the catalog's newest version and what the store's marker recorded, as JSON. A catalog the
    store refuses (the marker of another cluster or lost, a catalog older than the store has seen) is described
    all the same, with why (`refused`): its cluster id is what to check before `cluster accept-catalog`."""
    from logcompact.catalog.identity import read_marker

    catalog = ctx.catalog
    try:
        marker = catalog.marker
    except (ClusterMismatchError, StaleCatalogError, CorruptDataError) as refused:
        cluster_id, version = catalog.held_cluster()
        try:
            found = read_marker(catalog.store)
        except CorruptDataError:
            found = None  # `refused` says so
        emit({"cluster_id": cluster_id, "catalog_version": version, "marker": found and found.__dict__, "refused": str(refused)})
        return
    emit({"cluster_id": catalog.cluster_id, "catalog_version": catalog.latest_version(), "marker": marker.__dict__})


@cluster.command("accept-catalog")
@click.option("--cluster-id", required=True, metavar="ID",
              help="The cluster the catalog must hold: check it with `logcompact cluster describe` first.")
@now_option
@pass_context
def cluster_accept_catalog(ctx: Context, cluster_id: str) -> None:
    """Take the catalog, of cluster ID, as the store's: mark a store that lost its marker, or go on from a catalog
    restored from an older copy (files written after that copy then count as orphans for gc). A catalog holding
    another cluster than ID is refused, and so is a store marked as another cluster's than the catalog's."""
    marker = ctx.catalog.accept_catalog(cluster_id, ctx.clock())
    emit({"accepted": True, "cluster_id": marker.cluster_id, "seen_version": marker.seen_version})


@cluster.command("upgrade-catalog")
@pass_context
def cluster_upgrade_catalog(ctx: Context) -> None:
    """Upgrade a catalog of schema 3 to 10 to schema 11 in one transaction (docs/catalog.md says what each step
    changes). Stop the older release's agents and compactions and back the database up first. On a catalog at
    schema 11 there is nothing to do; another schema is refused."""
    from logcompact.catalog.schema import SCHEMA_VERSION

    upgrade = ctx.catalog.upgrade_catalog()
    if upgrade is None:
        emit({"upgraded": False, "schema_version": SCHEMA_VERSION, "note": f"the catalog is at schema version {SCHEMA_VERSION}: nothing to do"})
    else:
        emit({"upgraded": True, "from_schema_version": upgrade.from_schema_version, "schema_version": SCHEMA_VERSION,
               "sections_rewritten": upgrade.sections_rewritten})


@click.command()
@now_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of the table.")
@click.option("--plot", type=click.Path(dir_okay=False, writable=True), metavar="FILE.png",
              help="Also draw files and bytes per level, and bytes and dirty ratio per topic, into a PNG.")
@click.option("--topic", "topics", multiple=True, metavar="TOPIC",
              help="Only this compacted topic's partitions (repeatable); its gauges are then over these topics.")
@click.option("--worst", type=click.IntRange(min=1), default=None, metavar="N",
              help="Only the N worst partitions, the worst first: by dirty ratio, then by compaction delay.")
@pass_context
def status(ctx: Context, as_json: bool, plot: str | None, topics: tuple[str, ...], worst: int | None) -> None:
    """The cleaner's figures as Kafka's log cleaner names them: per partition of each compacted topic the dirty
    ratio, the delay past max.compaction.lag.ms, the time since its last compaction, the estimated duplicates
    and uncleanable marks, its last stable offset, how far that lags the high watermark, the open transactions on it
    and the oldest's age; files and bytes per level (docs/metrics.md). --topic and --worst pick what a large cluster's
    operator needs first; --json and --plot show the same partitions."""
    from logcompact.status import cluster_status, draw_status

    report = cluster_status(ctx.catalog, ctx.clock(), topics=topics or None, worst=worst)
    if plot:
        draw_status(report, Path(plot))
    if as_json:
        emit(report.to_dict())
    else:
        for line in report.describe():
            click.echo(line)
