"""A SIGTERM to pytest (kill, a CI job's timeout) stops the processes the running test started,
as Ctrl-C does: tests/conftest.py turns it into a KeyboardInterrupt, and the fixtures' teardown
runs."""

import os
import signal
import subprocess
import sys
import time

from helpers import REPO

# A test directory whose conftest is the project's own.
CONFTEST = f"""
import sys
sys.path[:0] = [{str(REPO / "tests")!r}, {str(REPO)!r}]
exec(compile(open({str(REPO / "tests" / "conftest.py")!r}).read(), "conftest.py", "exec"))
"""
SLEEPER_TEST = """
import time

def test_a_long_child(children):
    child = children(["sleep", "300"], "sleeper")
    print("sleeper", child.pid, flush=True)
    time.sleep(300)
"""


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_to_pytest_stops_the_running_tests_children(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_sleeper.py").write_text(SLEEPER_TEST)
    pytest = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        sleeper = None
        deadline = time.monotonic() + 120
        while sleeper is None and time.monotonic() < deadline:
            line = pytest.stdout.readline()
            if not line:
                break
            if "sleeper" in line:
                sleeper = int(line.split()[-1])
        assert sleeper is not None and alive(sleeper), "the inner test did not start its child"
        pytest.send_signal(signal.SIGTERM)
        output = pytest.communicate(timeout=60)[0]
        assert pytest.returncode != 0, output
        assert not alive(sleeper), f"pytest left its test's child {sleeper} running:\n{output}"
    finally:
        if pytest.poll() is None:
            pytest.kill()
            pytest.wait()
