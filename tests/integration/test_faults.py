"""Elastic training survives faults: peers and leaders killed, the broker restarted."""

import re
import signal
import sys
import time

import pytest
import torch
from helpers import CARTPOLE, experiment, free_port, wait_until

pytestmark = pytest.mark.slow

PROGRESS = re.compile(r"^steps +(\d+) .*\| version (\d+) \| peers (\d+) \| leader (\S+)")


def progress(child):
    """(env_train_steps, model_version, peers, leader) of the child's latest progress line,
    or zeros and None before the first one."""
    for line in reversed(child.lines):
        match = PROGRESS.match(line)
        if match:
            steps, version, peers, leader = match.groups()
            return int(steps), int(version), int(peers), leader
    return 0, 0, 0, None




def start_peer(children, broker, savedir, name, *extra):
    args = experiment(
        broker, savedir, *CARTPOLE, "total_steps=100000000", "log_interval=1",
        "checkpoint_interval=2", f"local_name={name}", *extra,
    )  # fmt: skip
    return children(args, name)


def start_pair(children, broker, savedir):
    peers = {name: start_peer(children, broker, savedir, name) for name in ("a", "b")}
    both = wait_until(lambda: all(progress(p)[2] == 2 for p in peers.values()), 120)
    assert both, {name: p.output[-2000:] for name, p in peers.items()}
    leader = progress(peers["a"])[3]
    assert leader in peers
    return peers, leader


def survives(peer, version_at_kill, timeout=60):
    """Seconds until `peer` trains alone past version_at_kill, or None."""
    start = time.monotonic()
    ok = wait_until(
        lambda: progress(peer)[2] == 1 and progress(peer)[1] > version_at_kill + 10, timeout
    )
    return time.monotonic() - start if ok else None


def test_killing_a_non_leader_does_not_stop_training(children, broker, tmp_path):
    savedir = tmp_path / "nonleader"
    peers, leader = start_pair(children, broker, savedir)
    victim = "b" if leader == "a" else "a"
    version = progress(peers[leader])[1]
    peers[victim].proc.kill()  # SIGKILL, the main process only: its env workers must follow
    recovery = survives(peers[leader], version)
    assert recovery is not None, peers[leader].output[-3000:]
    print(f"training went on {recovery:.1f} s after the non-leader was killed")

    # A newcomer joins and trains with the current model.
    before = progress(peers[leader])[1]
    newcomer = start_peer(children, broker, savedir, "c")
    line = newcomer.wait_for_line(lambda s: s.startswith("Received the learner state"), 120)
    assert line, newcomer.output
    assert int(line.rsplit(" ", 1)[1]) >= before
    assert wait_until(lambda: progress(newcomer)[2] == 2, 60), newcomer.output


def test_killing_the_leader_elects_another_that_keeps_checkpointing(children, broker, tmp_path):
    savedir = tmp_path / "leader"
    peers, leader = start_pair(children, broker, savedir)
    survivor = "b" if leader == "a" else "a"
    version = progress(peers[survivor])[1]
    peers[leader].proc.kill()
    killed_at = time.time()
    recovery = survives(peers[survivor], version)
    assert recovery is not None, peers[survivor].output[-3000:]
    assert wait_until(lambda: progress(peers[survivor])[3] == survivor, 30)
    print(f"training went on {recovery:.1f} s after the leader was killed")

    # The new leader writes checkpoints: a fresh one with a later model version appears.
    path = savedir / "checkpoint.tar"

    def newer_checkpoint():
        if not path.exists() or path.stat().st_mtime <= killed_at:
            return None
        return torch.load(path, weights_only=True)["model_version"] > version

    assert wait_until(newer_checkpoint, 30), peers[survivor].output[-2000:]


def test_training_survives_a_broker_restart(children, tmp_path):
    port = free_port()
    address = f"127.0.0.1:{port}"
    broker_args = [sys.executable, "-m", "moolib.broker", address]
    broker = children(broker_args, "broker")
    assert broker.wait_for_line(lambda s: "Broker listening" in s, 60)
    savedir = tmp_path / "broker"
    peers, leader = start_pair(children, address, savedir)

    broker.proc.kill()
    broker.wait(10)
    version = progress(peers[leader])[1]
    time.sleep(10)
    # The group lives on without its broker: the peers keep training together.
    for p in peers.values():
        assert p.proc.poll() is None, p.output[-2000:]
    assert progress(peers[leader])[1] > version, peers[leader].output[-2000:]

    broker = children(broker_args, "broker-again")
    assert broker.wait_for_line(lambda s: "Broker listening" in s, 60)
    restarted = time.monotonic()
    # Through the restarted broker a newcomer finds the group and receives its model.
    newcomer = start_peer(children, address, savedir, "c")
    line = newcomer.wait_for_line(lambda s: s.startswith("Received the learner state"), 120)
    assert line, newcomer.output
    assert wait_until(lambda: all(progress(p)[2] == 3 for p in [*peers.values(), newcomer]), 60)
    print(f"a newcomer trained with the group {time.monotonic() - restarted:.1f} s after restart")


def test_a_peer_waits_quietly_for_a_broker_that_is_not_there_yet(children, tmp_path):
    address = f"127.0.0.1:{free_port()}"
    peer = start_peer(children, address, tmp_path / "early", "early")
    assert peer.wait_for_line(lambda s: s.startswith("Waiting for the broker at " + address), 60)
    cpu_before, waited_from = peer_cpu_seconds(peer), time.monotonic()
    time.sleep(10)
    cpu = (peer_cpu_seconds(peer) - cpu_before) / (time.monotonic() - waited_from)
    assert cpu < 0.3, f"the waiting peer used {cpu:.0%} of a core"
    waiting_lines = sum(line.startswith("Waiting for the broker") for line in peer.lines)
    assert waiting_lines <= 4, "the waiting message is not rate-limited"
    broker = children([sys.executable, "-m", "moolib.broker", address], "late-broker")
    assert broker.wait_for_line(lambda s: "Broker listening" in s, 60)
    assert wait_until(lambda: progress(peer)[1] > 10, 90), peer.output[-2000:]
    print(f"the waiting peer used {cpu:.0%} of a core")


def peer_cpu_seconds(child):
    with open(f"/proc/{child.proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


def test_sigint_and_sigterm_exit_cleanly_with_a_final_checkpoint(children, broker, tmp_path):
    savedir = tmp_path / "signals"
    for sig in (signal.SIGINT, signal.SIGTERM):
        peer = start_peer(children, broker, savedir, f"p{int(sig)}", "checkpoint_interval=1000")
        assert wait_until(lambda p=peer: progress(p)[3], 120), peer.output
        before = time.time()
        peer.signal(sig)
        assert peer.wait(timeout=60) == 0, peer.output
        assert (savedir / "checkpoint.tar").stat().st_mtime >= before
        assert "Traceback" not in peer.output and "terminate called" not in peer.output
