"""examples/vtrace/cluster.py: a peer's name, folder and GPU from the peer index and the job
scheduler's environment, and the preemption signal turned into a clean stop before requeueing."""

import os
import signal
import subprocess
import sys

import pytest
from helpers import REPO
from omegaconf import OmegaConf

from examples.vtrace import cluster
from examples.vtrace.cluster import Launch


def flags(**overrides):
    base = {"savedir": "/s", "localdir": "${savedir}/peers/${local_name}", "local_name": "",
            "device": "auto", "peer": None}  # fmt: skip
    return OmegaConf.create({**base, **overrides})


SLURM_ARRAY_TASK = {
    "SLURM_JOB_ID": "1003", "SLURM_ARRAY_JOB_ID": "1000", "SLURM_ARRAY_TASK_ID": "3",
    "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NUM_NODES": "1",
}  # fmt: skip


def test_launch_from_slurm_variables():
    launch = cluster.current_launch(SLURM_ARRAY_TASK)
    assert launch == Launch("slurm", "1000_3", 0, 0, 1, 1)
    srun = {"SLURM_JOB_ID": "77", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8",
            "SLURM_JOB_NUM_NODES": "2"}  # fmt: skip
    launch = cluster.current_launch(srun)
    assert launch == Launch("slurm", "77", 5, 1, 8, 2) and launch.tasks_per_node == 4


def test_launch_from_submitit_local_variables():
    environ = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "4321",
               "SUBMITIT_LOCAL_GLOBALID": "0", "SUBMITIT_LOCAL_LOCALID": "0",
               "SUBMITIT_LOCAL_NTASKS": "1"}  # fmt: skip
    assert cluster.current_launch(environ) == Launch("local", "4321")
    assert cluster.current_launch({}) is None


def test_launch_through_submitits_job_environment(monkeypatch):
    for key, value in SLURM_ARRAY_TASK.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    assert cluster.current_launch() == Launch("slurm", "1000_3", 0, 0, 1, 1)


@pytest.mark.parametrize(
    "peer, launch, name",
    [
        (3, None, "peer3"),
        (3, Launch("slurm", "1000_3"), "peer3"),  # stable across requeues: same logs.tsv
        (0, Launch("slurm", "77", global_rank=2, num_tasks=4), "peer0-2"),
        (None, Launch("slurm", "1000_3"), "slurm-1000_3"),
        (None, Launch("local", "4321"), "local-4321"),
        (None, None, None),  # the experiment's HOSTNAME-PID default
    ],
)
def test_peer_name(peer, launch, name):
    assert cluster.peer_name(peer, launch) == name


def test_assign_identity_names_the_peer_and_its_folder():
    f = flags(peer=2)
    cluster.assign_identity(f, launch=None, gpu_count=0)
    assert f.local_name == "peer2" and f.localdir == "/s/peers/peer2" and f.device == "cpu"


def test_an_explicit_local_name_and_device_are_kept():
    f = flags(peer=2, local_name="mine", device="cuda:1")
    cluster.assign_identity(f, launch=Launch("slurm", "9"), gpu_count=4)
    assert f.local_name == "mine" and f.localdir == "/s/peers/mine" and f.device == "cuda:1"


def test_a_plain_localdir_gets_a_folder_per_peer():
    f = flags(peer=1, localdir="/scratch/logs")
    cluster.assign_identity(f, launch=None, gpu_count=0)
    assert f.localdir == os.path.join("/scratch/logs", "peer1")
    f = flags(localdir="/scratch/logs")  # a single peer keeps what it was given
    cluster.assign_identity(f, launch=None, gpu_count=0)
    assert f.localdir == "/scratch/logs"


@pytest.mark.parametrize(
    "peer, launch, gpus, device",
    [
        (None, None, 0, "cpu"),
        (5, None, 1, "cuda:0"),  # a Slurm job that was given one GPU sees only that one
        (5, Launch("local", "1"), 4, "cuda:1"),  # local jobs all see every GPU: by peer index
        (0, Launch("slurm", "7", global_rank=6, local_rank=2, num_tasks=8, num_nodes=2), 4,
         "cuda:2"),  # several tasks per node: by local rank
        (None, None, 2, "cuda:0"),
    ],
)  # fmt: skip
def test_auto_device(peer, launch, gpus, device):
    f = flags(peer=peer)
    cluster.assign_identity(f, launch=launch, gpu_count=gpus)
    assert f.device == device


@pytest.mark.parametrize("peer", [-2, "x", 1.5, True])
def test_bad_peer_index_is_one_clear_error(peer):
    with pytest.raises(ValueError, match="peer must be a peer index"):
        cluster.assign_identity(flags(peer=peer), launch=None, gpu_count=0)


def test_minus_one_means_no_peer_index():
    f = flags(peer=-1)
    cluster.assign_identity(f, launch=None, gpu_count=0)
    assert f.local_name == ""


class FakeSubmititHandler:
    """Stands in for submitit's SignalHandler: the class lives in a module named submitit...."""

    def __init__(self):
        self.calls = []

    def checkpoint_and_try_requeue(self, signum, frame):
        self.calls.append(signum)
        raise SystemExit(144)  # what submitit's local executor does to ask for a requeue


FakeSubmititHandler.__module__ = "submitit.core.job_environment"


@pytest.fixture
def restore_usr2():
    previous = signal.getsignal(signal.SIGUSR2)
    yield
    signal.signal(signal.SIGUSR2, previous)


def test_preemption_signal_stops_first_and_requeues_after(restore_usr2):
    handler = FakeSubmititHandler()
    signal.signal(signal.SIGUSR2, handler.checkpoint_and_try_requeue)
    stop = []
    preemption = cluster.Preemption()
    os.kill(os.getpid(), signal.SIGUSR2)  # before connect: kept
    preemption.connect(stop.append)
    os.kill(os.getpid(), signal.SIGUSR2)  # a second signal changes nothing
    assert stop == ["SIGUSR2: time limit or preemption"] and handler.calls == []
    assert preemption.will_requeue
    with pytest.raises(SystemExit) as exit_info:
        preemption.requeue_if_signalled()
    assert exit_info.value.code == 144 and handler.calls == [signal.SIGUSR2]


def test_without_submitit_the_signal_only_stops(restore_usr2):
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    stop = []
    preemption = cluster.Preemption()
    preemption.connect(stop.append)
    os.kill(os.getpid(), signal.SIGUSR2)
    assert stop and not preemption.will_requeue
    preemption.requeue_if_signalled()  # returns


def test_no_signal_no_requeue(restore_usr2):
    handler = FakeSubmititHandler()
    signal.signal(signal.SIGUSR2, handler.checkpoint_and_try_requeue)
    preemption = cluster.Preemption()
    preemption.connect(lambda reason: None)
    preemption.requeue_if_signalled()
    assert handler.calls == []


FORKED_WORKER = """
import os, signal, sys
from examples.vtrace import cluster

class Handler:
    def checkpoint_and_try_requeue(self, signum, frame):
        sys.exit(144)

Handler.__module__ = "submitit.core.job_environment"
signal.signal(signal.SIGUSR2, Handler().checkpoint_and_try_requeue)
stop = []
preemption = cluster.Preemption()
preemption.connect(stop.append)
child = os.fork()
if child == 0:  # an EnvPool worker: gets the signal too (Slurm signals the whole step)
    os.kill(os.getpid(), signal.SIGUSR2)
    os._exit(0 if preemption.signum is None else 1)
_, status = os.waitpid(child, 0)
print(os.WIFEXITED(status) and os.WEXITSTATUS(status), stop, preemption.will_requeue)
"""


def test_a_forked_child_survives_the_signal_and_leaves_it_to_the_parent():
    # In a fresh interpreter: moolib aborts a fork from a process where it has started threads,
    # as earlier tests in this one may have.
    result = subprocess.run(
        [sys.executable, "-c", FORKED_WORKER], capture_output=True, text=True, timeout=120,
        cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
    )  # fmt: skip
    assert result.stdout.split() == ["0", "[]", "False"], result.stdout + result.stderr


def test_preempt_signal_variable(monkeypatch):
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")
    assert cluster.preemption_signal() == signal.SIGUSR1
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "NOPE")
    with pytest.raises(ValueError, match="SUBMITIT_PREEMPT_SIGNAL=NOPE"):
        cluster.preemption_signal()


TEARDOWN_PROGRAM = """
import atexit, pathlib, sys
from examples.vtrace import cluster
# Registered first, so it runs last: stands for the interpreter's teardown that moolib can crash.
atexit.register(print, "teardown ran", flush=True)
cluster.skip_teardown_once_submitit_has_the_result()
if sys.argv[1] == "saved":
    pathlib.Path(sys.argv[2]).write_bytes(b"")
"""


@pytest.mark.parametrize("saved", [True, False])
def test_under_submitit_a_saved_result_ends_the_process_before_teardown(tmp_path, saved):
    env = {**os.environ, "SUBMITIT_EXECUTOR": "local", "SUBMITIT_FOLDER": str(tmp_path),
           "SUBMITIT_LOCAL_JOB_ID": "77", "SUBMITIT_LOCAL_GLOBALID": "0"}  # fmt: skip
    result = tmp_path / "77_0_result.pkl"  # where submitit saves job 77's result
    args = [sys.executable, "-c", TEARDOWN_PROGRAM, "saved" if saved else "none", str(result)]
    run = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert ("teardown ran" in run.stdout) is not saved, run.stdout


def test_outside_submitit_the_exit_is_untouched(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBMITIT")}
    args = [sys.executable, "-c", TEARDOWN_PROGRAM, "saved", str(tmp_path / "result.pkl")]
    run = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "teardown ran" in run.stdout, run.stdout + run.stderr
