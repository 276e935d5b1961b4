"""bench/results.py: a benchmark's run replaces its own command's section of the results page, stamped, and leaves
the other commands' sections as they were."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import results


def test_a_run_replaces_its_section_and_keeps_the_others(tmp_path: Path) -> None:
    page = tmp_path / "results.md"
    page.write_text("# Benchmark results\n\nHow to read this page.\n")
    results.record("python bench/a.py", "a: 1.0 s\n", page)
    results.record("python bench/b.py --files 9", "b: 2.0 s\n", page)
    results.record("python bench/a.py", "a: 0.5 s\n", page)
    text = page.read_text()
    assert text.startswith("# Benchmark results\n\nHow to read this page.\n\n## `python bench/a.py`\n")
    assert "a: 1.0 s" not in text and text.count("## `python bench/a.py`") == 1
    a, b = text.split("## `python bench/a.py`")[1].split("## `python bench/b.py --files 9`")
    assert "```\na: 0.5 s\n```" in a and "```\nb: 2.0 s\n```" in b
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    stamp = a.strip().splitlines()[0]
    assert f"commit {head}" in stamp and "load average" in stamp and " UTC; " in stamp
    assert results.cpu_model() in stamp


def test_a_script_records_what_it_printed_only_when_it_succeeds(tmp_path: Path) -> None:
    page = tmp_path / "results.md"
    script = tmp_path / "fast.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'bench')!r})\n"
        "from pathlib import Path\n"
        "from results import recorded\n"
        f"with recorded(Path({str(page)!r})):\n"
        "    print('figure: 42 ms')\n"
        "    if '--fail' in sys.argv:\n"
        "        raise SystemExit('failed')\n"
    )
    done = subprocess.run([sys.executable, str(script), "--runs", "1"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("figure: 42 ms\n")
    assert results.cpu_model() in done.stdout.splitlines()[-1] and "load average" in done.stdout.splitlines()[-1]
    command = f"python {script} --runs 1"
    assert f"## `{command}`" in page.read_text() and "```\nfigure: 42 ms\n```" in page.read_text()
    before = page.read_text()
    failed = subprocess.run([sys.executable, str(script), "--fail"], capture_output=True, text=True)
    assert failed.returncode == 1 and page.read_text() == before


def test_a_run_measuring_another_checkouts_library_names_it_and_its_commit(tmp_path: Path) -> None:
    """Two codes are compared by running one script alternately with `PYTHONPATH=OTHER/include`: the stamp names the
    library measured and its commit, not only this checkout's, and without PYTHONPATH names none."""
    other = tmp_path / "other"
    (other / "include" / "logcompact").mkdir(parents=True)
    (other / "include" / "logcompact" / "__init__.py").write_text("")
    git = ["git", "-C", str(other), "-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "another library"], check=True)
    other_head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    page = tmp_path / "results.md"
    script = tmp_path / "measure.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'bench')!r})\n"
        "from pathlib import Path\n"
        "import logcompact\n"
        "from results import recorded\n"
        f"with recorded(Path({str(page)!r})):\n"
        "    print('figure: 1 ms')\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(other / "include")}
    stamp = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True, env=env).stdout.splitlines()[-1]
    assert f"; library {other / 'include'} at commit {other_head}; " in stamp
    stamp = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout.splitlines()[-1]
    assert "library" not in stamp
