"""Every object a cluster keeps in its store, named in one place (as Kafka's `LogFileUtils` names a log's files):

    cluster.json                                      the store's cluster marker (catalog/identity.py)
    data/l0/{now_ms:013d}-{uuid hex}.seg              an agent's L0 file, its clock first
    data/l{level}/{plan_id}-g{group}-s{slice}-{content}-{sequence}.seg   a compaction's output
    plans/{plan_id}/plan.json, inputs.arrow           a stored plan's header and input files (plans/documents.py)
    plans/{plan_id}/groups/g{group}.arrow             a group's document
    plans/{plan_id}/results/g{group}.json             a group's results
    plans/{plan_id}/abandoned.json                    a plan whose run failed and could not release it

gc deletes only objects whose names these patterns match (docs/plan.md, docs/catalog.md)."""

from __future__ import annotations

import re
import uuid

MARKER_KEY = "cluster.json"

DATA_PREFIX = "data/"
# What data files are called, and what `new_plan_id` makes (a compaction output's name starts with its plan id).
DATA_KEY_PATTERN = re.compile(r"data/l([0-4])/[A-Za-z0-9][A-Za-z0-9._-]{0,199}\.seg")
PLAN_ID_PATTERN = re.compile(r"p[0-9]{1,19}-[0-9a-f]{12}")
# An agent's L0 file: `l0_key`'s names, its clock first (gc tells a dead agent's file by it).
L0_NAME_PATTERN = re.compile(r"[0-9]{13,19}-[0-9a-f]{32}\.seg")

PLANS_PREFIX = "plans/"
# A stored plan is a directory of objects: its header (these two), groups/ and, once its groups have run, results/.
HEADER_NAME = "plan.json"
INPUTS_NAME = "inputs.arrow"
# Written beside a plan whose run failed and could not release it in the catalog (`release_abandoned`).
ABANDONED_NAME = "abandoned.json"


def l0_key(now_ms: int) -> str:
    """A new L0 file's key: unique whoever writes it, and sorted by when."""
    return f"{DATA_PREFIX}l0/{now_ms:013d}-{uuid.uuid4().hex}.seg"


def output_key(plan_id: str, level: int, group: int, slice_: int, content: str, sequence: int) -> str:
    """A compaction output's key: the plan, group and slice that wrote it, its content class and its place among them."""
    return f"{DATA_PREFIX}l{level}/{plan_id}-g{group:03d}-s{slice_:03d}-{content}-{sequence:04d}.seg"


def is_agent_l0_key(key: str) -> bool:
    """Whether `key` is an L0 file's as agents name them (`l0_key`)."""
    return key.startswith(f"{DATA_PREFIX}l0/") and L0_NAME_PATTERN.fullmatch(key.rsplit("/", 1)[-1]) is not None


def plan_of_output(key: str) -> str:
    """The plan id an output's name starts with (`data/l2/{plan_id}-g000-...`)."""
    return key.rsplit("/", 1)[-1].split("-g")[0]


def plan_key(plan_id: str, prefix: str = PLANS_PREFIX) -> str:
    return f"{prefix}{plan_id}/{HEADER_NAME}"


def inputs_key(plan_id: str, prefix: str = PLANS_PREFIX) -> str:
    return f"{prefix}{plan_id}/{INPUTS_NAME}"


def group_key(plan_id: str, group: int, prefix: str = PLANS_PREFIX) -> str:
    return f"{prefix}{plan_id}/groups/g{group:03d}.arrow"


def result_key(plan_id: str, group: int) -> str:
    return f"{PLANS_PREFIX}{plan_id}/results/g{group:03d}.json"


def abandoned_key(plan_id: str) -> str:
    return f"{PLANS_PREFIX}{plan_id}/{ABANDONED_NAME}"
