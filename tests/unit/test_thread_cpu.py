"""bench/thread_cpu.py: a process's threads followed until it ends, their CPU counted."""

import subprocess
import sys
import uuid

import pytest

from bench import thread_cpu

pytestmark = pytest.mark.skipif(
    not thread_cpu.PROC.joinpath("self", "schedstat").exists(), reason="needs Linux's /proc"
)

# Burns 2 s of its own CPU (however busy the machine), but never runs past 30 s of wall time.
BURN = """
import sys, time
deadline = time.monotonic() + 30
while time.process_time() < 2.0 and time.monotonic() < deadline:
    pass
"""


def test_follows_a_process_until_it_ends_and_counts_its_cpu():
    marker = f"thread-cpu-test-{uuid.uuid4().hex}"
    child = subprocess.Popen([sys.executable, "-c", BURN, marker])
    try:
        summary = thread_cpu.follow(marker, start_timeout=30, interval=0.2)
        assert child.wait(timeout=30) == 0  # follow() returned only once it had ended
    finally:
        child.kill()
        child.wait()
    main_thread = f"{child.pid}/{child.pid}"
    assert [row["thread"] for row in summary["threads"]] == [main_thread]
    # All but the last interval's CPU (at most 0.2 s) and the start before the first sample.
    assert 1.5 <= summary["threads_cpu_s"] <= 2.5
    assert summary["never_idle_wall_s"] == pytest.approx(
        summary["threads_cpu_s"] / summary["cores"]
    )
    assert 0 <= summary["machine_busy_cores"] <= summary["cores"]
    assert main_thread in thread_cpu.report(summary)


def test_no_such_process_is_a_one_line_error(capsys):
    marker = f"thread-cpu-nothing-{uuid.uuid4().hex}"
    assert thread_cpu.main([marker, "--start-timeout", "0.3"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("thread_cpu: error:") and marker in err and "\n" not in err
