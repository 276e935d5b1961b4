"""Plans a failed run leased and did not commit, released so their files can be planned again at once: by the
run itself (`give_up`), or, when the catalog could not be reached then, once it answers (`release_abandoned`)."""

from __future__ import annotations

import logging

from logcompact.catalog import Catalog
from logcompact.keys import abandoned_key
from logcompact.plans.documents import abandoned_plans, write_abandoned

log = logging.getLogger(__name__)


def give_up(catalog: Catalog, plan_ids: list[str], now_ms: int, failure: BaseException) -> list[str]:
    """Release the plans a failed run leased and did not commit, so their files can be planned again at once. A plan
    the catalog cannot release now (the database that failed the run is still gone) is logged and recorded as
    abandoned in the store, and `release_abandoned` releases it once the catalog answers; a plan that cannot be
    recorded either keeps its files leased until its lease expires, which is logged too. Never raises: the run's
    own failure is what its caller reports. Returns the plans recorded as abandoned."""
    reason = " ".join(str(failure).split()) or type(failure).__name__
    abandoned = []
    for plan_id in plan_ids:
        try:
            if not catalog.is_committed(plan_id):
                catalog.release(plan_id)
            continue
        except Exception as release_failure:  # logged; the run's failure is what is raised
            why = " ".join(str(release_failure).split()) or type(release_failure).__name__
        try:
            key = write_abandoned(catalog.store, plan_id, now_ms, reason)
        except Exception as record_failure:
            log.error(
                "plan %s: could not be released after the run failed (%s), nor recorded as abandoned (%s): its files stay "
                "leased until its lease expires", plan_id, why, " ".join(str(record_failure).split()),
            )
            continue
        abandoned.append(plan_id)
        log.warning(
            "plan %s: could not be released after the run failed (%s); recorded as abandoned in %s, so gc or the next "
            "plan step releases it once the catalog answers", plan_id, why, key,
        )
    return abandoned


def release_abandoned(catalog: Catalog) -> list[str]:
    """Release in the catalog the leases and seal of every plan a failed run abandoned (`write_abandoned`), unless
    it committed after all, and drop its record; returns those plans' ids. A plan abandoned when the catalog was
    unreachable frees its files here, once the catalog answers, instead of when its lease expires. Call it where the
    catalog is in use anyway: gc and the plan step."""
    released = []
    for plan_id in abandoned_plans(catalog.store):
        if catalog.is_committed(plan_id):
            log.info("plan %s, recorded as abandoned, committed after all: nothing to release", plan_id)
        else:
            catalog.release(plan_id)
            log.warning("released plan %s, abandoned by a run that failed and could not release it then", plan_id)
        catalog.store.delete(abandoned_key(plan_id))
        released.append(plan_id)
    return released
