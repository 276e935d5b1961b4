"""The bounds and defaults of logcompact's settings, in one module that imports nothing heavy: plans are checked against
them (docs/plan.md), the planner, agents and gc default to them, and the command line's and the Airflow forms' options
show them without loading the engine or the catalog."""

from __future__ import annotations

from logcompact.units import MINUTE_MS, GiB, MiB

# What the planner makes: levels and size tiers, the max-lag pass, the daily full sweep (docs/planner.md).
MODES = ("regular", "max-lag", "full")
MAX_LEVEL = 4

# The planner's defaults the command line shows (`PlannerConfig` holds the rest): a level is compacted into the next
# once it holds this many files, plans are split into groups of about this much input, and the max-lag pass assumes
# the next pass this far off.
DEFAULT_MIN_FILES = 32
DEFAULT_GROUP_BYTES = GiB
DEFAULT_MAX_LAG_PASS_INTERVAL_MS = 15 * MINUTE_MS

DEFAULT_TARGET_FILE_BYTES = 256 * MiB
# The key map's buffer of each job: WarpStream's 128 MiB.
DEFAULT_BUFFER_BYTES = 128 * MiB
DEFAULT_MAX_PARTITION_BYTES = 128 * GiB
# Bounds a plan's sizes must keep (docs/plan.md). Kafka caps each cleaner thread's dedupe buffer at 2 GiB; an
# output file is written whole to local disk before its PUT; no byte count may overflow an int64 sum.
MIN_BUFFER_BYTES = 40
MAX_BUFFER_BYTES = 2 * GiB
MAX_TARGET_FILE_BYTES = 16 * GiB
MAX_BYTE_COUNT = 1 << 50
# A plan's clock is the caller's within these bounds (docs/plan.md): no older than a plan's lease lasts by
# default (a plan's min lag, retention and horizons are judged at its clock), and no later than clocks drift.
MAX_PLAN_AGE_MS = 60 * MINUTE_MS
MAX_CLOCK_SKEW_MS = 5 * MINUTE_MS

# An agent writes and commits an L0 file this often, or once this many bytes are buffered.
DEFAULT_FLUSH_INTERVAL_MS = 250
DEFAULT_FLUSH_BYTES = 32 * MiB
# A buffer holding 1/EARLY_SHARE of flush_bytes is flushed once its first batch is FILL_MS old, without waiting to be
# full. Each file costs the agent a few ms of CPU whatever its size (its encoding, the store's write, the catalog's
# commit), so files filled in a few ms would spend much of a core on that: records arriving that fast fill a file for
# FILL_MS, up to flush_bytes. Slower ones are flushed at the quarter, so their acks do not wait for a larger file
# (bench/README.md, Produce against Apache Kafka).
EARLY_SHARE = 4
FILL_MS = 30

# gc keeps unreferenced objects this long (an output of a job still running, a plan not yet committed).
DEFAULT_GC_GRACE_MS = 60 * MINUTE_MS
# gc deletes no unreferenced object when more than this share of the store's data objects would go, and at least
# MIN_ORPHANS_CHECKED of them (a small cluster's one aborted output is no sign of another cluster's catalog).
DEFAULT_MAX_ORPHAN_SHARE = 0.5

# The agent's TLS listeners (kafka/tls.py): the key file's password is read from this environment variable only (never
# an argument, which `ps` shows), the handshake's bound, and Kafka's ssl.principal.mapping.rules default.
SSL_KEY_PASSWORD_ENV = "LOGCOMPACT_SSL_KEY_PASSWORD"
DEFAULT_SSL_HANDSHAKE_TIMEOUT_MS = 10_000
DEFAULT_SSL_PRINCIPAL_MAPPING_RULES = "DEFAULT"
