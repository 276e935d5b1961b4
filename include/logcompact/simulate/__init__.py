"""The simulator: ingest, the planner and the engine's cost model over simulated hours (see simulator.py)."""

from logcompact.planner import PlannerConfig
from logcompact.simulate.simulator import Simulation, SimulationResult, Workload, compare

HOUR_MS = 3_600_000

# The reference's rules taken literally: 32 files a level, tiers of 10 files of similar size (within 2x),
# the daily sweep, and an hourly max-lag pass that compacts what is dirty when it runs.
LITERAL_RULES = PlannerConfig(tier_size_ratio=2.0, max_lag_pass_interval_ms=HOUR_MS, max_lag_deadline_ms=HOUR_MS)
# logcompact's planner with the same hourly pass: it also compacts what would otherwise have been dirty
# for more than 30 minutes by the next pass.
LOGCOMPACT = PlannerConfig(max_lag_pass_interval_ms=HOUR_MS)
# For the record of why the default tier ratio is 2x: the same, with tiers within 4x.
WIDE_TIERS = PlannerConfig(tier_size_ratio=4.0, max_lag_pass_interval_ms=HOUR_MS)

__all__ = ["LITERAL_RULES", "LOGCOMPACT", "WIDE_TIERS", "Simulation", "SimulationResult", "Workload", "compare"]
