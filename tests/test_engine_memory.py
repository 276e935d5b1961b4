"""A job's peak memory stays flat when its input grows tenfold (sections stream batch by batch, the key
map is bounded, output sections spool to disk)."""

from __future__ import annotations

import json
import subprocess
import sys


def _peak_rss_kib(workdir, per_key: int) -> dict:
    command = [sys.executable, "-m", "tests.support.memory_job"]
    subprocess.run([*command, "write", str(workdir), str(per_key)], check=True, timeout=300)
    done = subprocess.run([*command, "run", str(workdir)], check=True, capture_output=True, text=True, timeout=300)
    return json.loads(done.stdout)


def test_peak_memory_is_flat_when_the_input_grows_tenfold(tmp_path) -> None:
    small = _peak_rss_kib(tmp_path / "small", per_key=2)  # 40,000 records of 1 KB: 40 MB
    large = _peak_rss_kib(tmp_path / "large", per_key=20)  # 400,000 records: 400 MB
    assert large["bytes_in"] > 9 * small["bytes_in"]
    assert small["records_out"] == large["records_out"] == 20_000
    growth_kib = large["rss_peak_kib"] - small["rss_peak_kib"]
    assert growth_kib < 48 * 1024, f"peak RSS grew by {growth_kib // 1024} MiB for 10x the input: {small} -> {large}"
