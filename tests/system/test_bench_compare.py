"""`make bench-compare A B` (benches/compare.py) judges two bench result files:
a target met in A and missed in B is a regression and fails the command."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def results(tmp_path, name, value, met):
    path = tmp_path / name
    path.write_text(json.dumps({
        "machine": "2 cores, test", "date": "2026-11-30T00:00:00Z",
        "targets": [
            {"name": "fast path p99 vs baseline, c=1", "value": value, "target": "<= 1.1", "met": met},
            {"name": "timer lateness p99 (ms)", "value": 1.0, "target": "<= 2", "met": True},
        ],
        "figures": {"fast-path": {"c1.router_p99_ms": value}},
    }))
    return path


def compare(*args):
    return subprocess.run(["make", "-s", "-C", str(ROOT), "bench-compare", *map(str, args)],
                          capture_output=True, text=True, timeout=60)


def test_a_target_met_then_missed_is_a_regression(tmp_path):
    run = compare(results(tmp_path, "a.json", 1.05, True), results(tmp_path, "b.json", 1.3, False))
    assert run.returncode != 0, run.stdout
    assert "REGRESSED" in run.stdout
    assert "c1.router_p99_ms: 1.050 -> 1.300 (+23.8%)" in run.stdout


def test_a_target_fixed_or_kept_passes(tmp_path):
    run = compare(results(tmp_path, "a.json", 1.3, False), results(tmp_path, "b.json", 1.05, True))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "fixed" in run.stdout and "REGRESSED" not in run.stdout


def test_an_unreadable_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    run = compare(bad, results(tmp_path, "b.json", 1.0, True))
    assert run.returncode != 0
    assert "bad.json" in run.stderr


def test_the_bench_writes_what_the_comparer_reads():
    # The keys compare.py reads are the ones report.rs writes.
    report = (ROOT / "benches/parking/report.rs").read_text()
    for key in ('\\"name\\"', '\\"value\\"', '\\"target\\"', '\\"met\\"', '\\"figures\\"', '\\"targets\\"'):
        assert key in report, key
