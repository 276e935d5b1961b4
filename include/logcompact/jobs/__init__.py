"""The compaction job, one retry-safe function per step, with no Airflow or Spark imported here. The CLI's
`compact`, the Airflow operators and the Spark application all call these same steps:

1. `prepare_plans` / `lease_and_write`: plan against the catalog as it is now (`check_thresholds` says which
   levels are due), lease the plans' files in the catalog (all the plans or none) with a seal of their
   documents, and write the documents to the store (`logcompact.plans.documents`); one `GroupJob` per group the plans record.
2. `run_group`: run one group from the store alone, given the plan id and the group number, its slices one
   after the other or as Spark tasks (a `SliceMapper`; each task runs a `GroupSlice`), and leave its result next
   to its plan; `run_here` runs a prepared run's groups and commits.
3. `commit_plans`: commit every plan from its header and its groups' results, atomically and once; a retry
   finds the plan already committed and reports the same stats from the results kept in the store.
4. `collect_garbage`: what no kept version references, abandoned outputs and finished plans, past a grace.

A group that fails leaves its plan uncommitted and its files leased until the lease expires; retrying the
group resumes the plan, and groups whose results are already in the store are not run again. A run that fails
where nothing resumes it (`run_here`) releases its plans, or, when the catalog cannot be reached to do so, records
them as abandoned in the store for `release_abandoned` to release once it answers.
"""

from logcompact.exceptions import LogcompactError  # what every step raises for a user to read, in one line
from logcompact.jobs.commit import CommitSummary, PlanResult, commit_plan, commit_plans, uncleanable_report
from logcompact.jobs.gc import DEFAULT_GC_GRACE_MS, GcReport, collect_garbage
from logcompact.jobs.prepare import GroupJob, PreparedRun, ThresholdStatus, check_thresholds, lease_and_write, prepare_plans
from logcompact.jobs.release import give_up, release_abandoned
from logcompact.jobs.run import IN_ORDER, GroupSlice, SliceMapper, deal_slices, group_report, run_and_commit, run_group, run_here, run_slice, run_task
from logcompact.plans import JobResult

__all__ = [
    "DEFAULT_GC_GRACE_MS",
    "IN_ORDER",
    "CommitSummary",
    "GcReport",
    "GroupJob",
    "GroupSlice",
    "JobResult",
    "LogcompactError",
    "PlanResult",
    "PreparedRun",
    "SliceMapper",
    "ThresholdStatus",
    "check_thresholds",
    "collect_garbage",
    "commit_plan",
    "commit_plans",
    "deal_slices",
    "give_up",
    "group_report",
    "lease_and_write",
    "prepare_plans",
    "release_abandoned",
    "run_and_commit",
    "run_group",
    "run_here",
    "run_slice",
    "run_task",
    "uncleanable_report",
]
