"""The simulator's outputs: the side-by-side table, the JSON summary and the PNG plots."""

from __future__ import annotations

import json
from pathlib import Path

from logcompact.lab.simulate.simulator import SimulationResult

COLUMNS = [
    ("planner", "planner", "{}"),
    ("write_amplification", "write ampl.", "{:.2f}"),
    ("gets_per_gib", "GETs/GiB", "{:,.0f}"),
    ("puts_per_gib", "PUTs/GiB", "{:,.0f}"),
    ("dedup_delay_p50_s", "dedup p50 s", "{}"),
    ("dedup_delay_p99_s", "dedup p99 s", "{}"),
    ("past_min_lag_p99_s", "past min lag p99 s", "{}"),
    ("past_min_lag_max_s", "max s", "{}"),
    ("max_lag_violations", "max-lag viol.", "{:,}"),
    ("max_minutes_past_lag", "max min past lag", "{:,.1f}"),
    ("duplicates_at_rest_end", "dup. at rest", "{:.1%}"),
    ("live_files_end", "live files", "{}"),
]


def table(title: str, results: list[SimulationResult]) -> str:
    rows = [[fmt.format(r.summary()[key]) for key, _, fmt in COLUMNS] for r in results]
    headers = [label for _, label, _ in COLUMNS]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return "\n".join([title, line(headers), *(line(row) for row in rows)])


def write(out: Path, name: str, results: list[SimulationResult]) -> list[Path]:
    """`{name}.json` and two PNG plots in `out`; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    summary = out / f"{name}.json"
    summary.write_text(json.dumps({"summaries": [r.summary() for r in results], "runs": [r.to_dict() for r in results]}, indent=1))
    written = [summary]

    figure, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), sharey=True, squeeze=False)
    for axis, result in zip(axes[0], results):
        hours = [h for h, _ in result.files_per_level]
        for level in range(5):
            counts = [levels[level] for _, levels in result.files_per_level]
            if any(counts):
                axis.plot(hours, counts, label=f"L{level}")
        axis.set_title(f"{result.name}: live files per level")
        axis.set_xlabel("simulated hours")
        axis.legend()
    axes[0][0].set_ylabel("files")
    figure.tight_layout()
    files_plot = out / f"{name}-files.png"
    figure.savefig(files_plot, dpi=80)
    plt.close(figure)
    written.append(files_plot)

    figure, axis = plt.subplots(figsize=(7, 4))
    for result in results:
        axis.plot([h for h, _ in result.duplicate_fraction], [f for _, f in result.duplicate_fraction], label=result.name)
    axis.set_title("duplicate records at rest")
    axis.set_xlabel("simulated hours")
    axis.set_ylabel("fraction of live records")
    axis.legend()
    figure.tight_layout()
    duplicates_plot = out / f"{name}-duplicates.png"
    figure.savefig(duplicates_plot, dpi=80)
    plt.close(figure)
    written.append(duplicates_plot)
    return written
