"""``python -m benchmarks.server_profile``: perf's report read right, and a profiled run
of the minimal lease queue and pgworker's statements end to end on the local server.
Nothing here compares speeds (the figures are samples of CPU time)."""

from __future__ import annotations

import shutil

import pytest

from benchmarks import server_profile
from pgcluster import require

pytestmark = pytest.mark.integration

REPORT = """
# Children      Self  Symbol
    98.97%     0.11%  [.] PostgresMain                               -      -
    21.14%     0.12%  [.] ExecInsertIndexTuples                      -      -
     9.47%     0.04%  [k] do_syscall_64                              -      -
     6.33%     0.04%  [.] standard_ExecutorStart                     -      -
     3.43%     0.04%  [.] standard_ExecutorEnd                       -      -
    81.43%     0.00%  [.] 0x00005611f3d22058                         -      -
"""


def test_the_inclusive_shares_are_read_from_perfs_report():
    shares = server_profile.inclusive_shares(REPORT)
    assert shares["ExecInsertIndexTuples"] == 21.14 and shares["do_syscall_64"] == 9.47
    assert shares["standard_ExecutorStart"] + shares["standard_ExecutorEnd"] == pytest.approx(9.76)
    assert "Children" not in shares


@pytest.mark.timeout(600)
def test_a_profiled_run_attributes_each_variants_cpu(pg_dsn, capsys, tmp_path):
    require(None if shutil.which("perf") else "benchmarks.server_profile needs perf (apt-get install linux-perf)")
    out = tmp_path / "profile.json"
    assert server_profile.main(["--dsn", pg_dsn, "--jobs", "3000", "--variant", "ref,today",
                                "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("| part (µs per job, claim + completion) | ref | today |")
    import json
    results = json.loads(out.read_text())
    for name in ("ref", "today"):
        r = results[name]
        assert 0 < r["jobs"] <= 3000 and r["us_per_job"] > 0  # the warm-up claims are not sampled
        assert r["parts"]["index entries inserted (non-HOT row versions)"] > 0
        assert sum(r["parts"].values()) == pytest.approx(r["us_per_job"], abs=0.1)
        assert any(sym == "ExecInsertIndexTuples" for sym, _ in r["top"])
