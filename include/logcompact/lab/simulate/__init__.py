"""The simulator: ingest, the planner and the engine's cost model over simulated hours (see simulator.py)."""

from logcompact.lab.simulate.simulator import Simulation, SimulationResult, Workload, compare
from logcompact.planner import PlannerConfig
from logcompact.units import HOUR_MS

# The reference's rules taken literally: 32 files a level, tiers of 10 files of similar size (within 2x),
# the daily sweep, and an hourly max-lag pass that compacts what is dirty when it runs.
LITERAL_RULES = PlannerConfig(tier_size_ratio=2.0, max_lag_pass_interval_ms=HOUR_MS, max_lag_deadline_ms=HOUR_MS)
# logcompact's planner with the same hourly pass: it also compacts what would otherwise have been dirty
# for more than 30 minutes by the next pass.
LOGCOMPACT = PlannerConfig(max_lag_pass_interval_ms=HOUR_MS)
# For the record of why the default tier ratio is 2x: the same, with tiers within 4x.
WIDE_TIERS = PlannerConfig(tier_size_ratio=4.0, max_lag_pass_interval_ms=HOUR_MS)

# What `logcompact simulate` compares, each a planner and its topics' min.cleanable.dirty.ratio. The reference's
# rules know no ratio (1.0: a top level is taken again only by its tiers, the max-lag pass and the sweep);
# logcompact's planner at Kafka's default ratio, and with the ratio off for its cost.
RUNS = {"literal rules": (LITERAL_RULES, 1.0), "logcompact": (LOGCOMPACT, 0.5), "logcompact, ratio off": (LOGCOMPACT, 1.0)}

# A WarpStream-like cluster: 1,000 partitions over 10 topics, 10 agents each writing 4 files a second (every
# L1 file holds about 1,000 sections), keys spread over all partitions, a 2 h max lag. Three hours reach past
# the deadline and its 30-minute grace. An hour takes about 5 s a planner on one core (bench/simulator.py), half of it
# the planner's, which reads the 4.5 million sections an hour as the files' columns.
WARPSTREAM_LIKE = Workload(agents=10, topics=10, partitions=100, keys=1_000_000, hours=3.0, max_lag_ms=2 * HOUR_MS)

__all__ = [
    "LITERAL_RULES", "LOGCOMPACT", "RUNS", "WARPSTREAM_LIKE", "WIDE_TIERS", "Simulation", "SimulationResult", "Workload", "compare",
]
