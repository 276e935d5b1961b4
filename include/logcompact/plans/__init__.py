"""A compaction plan's whole life (docs/plan.md), below the planner that makes plans and the engine and jobs that
run and commit them:

- `model`: the plan, its header, their checks alone and against the catalog;
- `grouping`: its groups of whole partitions and what planners read of its inputs;
- `json_form`: the single JSON document (`logcompact plan`, `compact --plan`) and the JSON fields of the rest;
- `arrow_form`: the stored form, a header and one Arrow document per group;
- `documents`: those documents and the groups' results in the store;
- `results`: what a job did, its outputs and stats, and a plan's figures added up.
"""

from logcompact.plans.arrow_form import decode_group, decode_header, encode_groups, encode_header
from logcompact.plans.documents import (
    group_done,
    plan_documents,
    read_cluster_id,
    read_group,
    read_header,
    read_partition_bytes,
    read_plan,
    read_results,
    write_group_result,
    write_plan,
)
from logcompact.plans.grouping import InputOffsets, PlanGroup, PlannedInputs, input_keys, input_offsets, input_sections, lowest_outside, split_into_groups
from logcompact.plans.json_form import PLAN_FORMAT, file_from_json, file_to_json, plan_from_dict, plan_from_json, plan_to_dict, plan_to_json
from logcompact.plans.model import InputFile, Plan, PlanHeader, hidden_offsets_reason, new_plan_id
from logcompact.plans.results import CompactionStats, JobResult, summarize

__all__ = [
    "PLAN_FORMAT",
    "CompactionStats",
    "InputFile",
    "InputOffsets",
    "JobResult",
    "Plan",
    "PlanGroup",
    "PlanHeader",
    "PlannedInputs",
    "decode_group",
    "decode_header",
    "encode_groups",
    "encode_header",
    "file_from_json",
    "file_to_json",
    "group_done",
    "hidden_offsets_reason",
    "input_keys",
    "input_offsets",
    "input_sections",
    "lowest_outside",
    "new_plan_id",
    "plan_documents",
    "plan_from_dict",
    "plan_from_json",
    "plan_to_dict",
    "plan_to_json",
    "read_cluster_id",
    "read_group",
    "read_header",
    "read_partition_bytes",
    "read_plan",
    "read_results",
    "split_into_groups",
    "summarize",
    "write_group_result",
    "write_plan",
]
