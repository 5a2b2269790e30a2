"""`python -m moolib.broker` ends with status 0 on SIGINT and on SIGTERM, every time, also when the
signal reaches its peers at the same moment (build_moolib.py's fix 6). A race: several rounds."""

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import free_port

# A stand-in peer: an Rpc in a Group, pinging the broker until a signal ends it.
PEER = r"""
import sys, time, moolib
rpc = moolib.Rpc()
rpc.set_name(sys.argv[2])
rpc.connect(sys.argv[1])
group = moolib.Group(rpc, "signals")
try:
    while True:
        group.update()
        if len(group.members()) == 2:
            print("joined", flush=True)
        time.sleep(0.05)
except KeyboardInterrupt:
    pass
"""
ROUNDS = 4


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_broker_ends_cleanly_on_a_signal_to_its_process_group(sig):
    for round_ in range(ROUNDS):
        address = f"127.0.0.1:{free_port()}"
        # The broker leads a process group of its own, as in a terminal: the peers join it.
        broker = subprocess.Popen([sys.executable, "-m", "moolib.broker", address],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  process_group=0)  # fmt: skip
        peers = []
        try:
            assert "Broker listening" in broker.stdout.readline()
            peers = [subprocess.Popen([sys.executable, "-c", PEER, address, f"peer{i}"],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, process_group=broker.pid)  # fmt: skip
                     for i in range(2)]  # fmt: skip
            for peer in peers:
                assert "joined" in peer.stdout.readline()
            time.sleep(0.1 * round_)  # the signal lands at other moments of the loop
            os.killpg(broker.pid, sig)
            output, _ = broker.communicate(timeout=20)
            assert broker.returncode == 0, (round_, broker.returncode, output)
            assert f"Broker stopped ({sig.name})" in output, output
            assert "Traceback" not in output
        finally:
            for proc in [broker, *peers]:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(10)
