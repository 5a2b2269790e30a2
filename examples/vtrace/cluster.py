"""Running many peers as one job: Slurm array jobs and local processes through Hydra's submitit
launcher (`-m hydra/launcher=slurm peer='range(8)'`), or plain `srun`.

Three things depend on where a peer was started, and this module decides them:

- its identity: `local_name` (and so `localdir`, `${savedir}/peers/${local_name}` by default)
  is `peer<index>` for the `peer` index of a sweep, so that a requeued peer finds its own
  logs again; a job started without `peer` is named after its Slurm or submitit job id;
- its GPU: with `device=auto` and several visible GPUs, peers that share a machine take
  different ones (the task's local rank, or the peer index when each job is one task);
- what a preemption signal does: Slurm sends SIGUSR2 before a time limit or (with
  PreemptParameters=send_user_signal) a preemption, and submitit's handler for it requeues the
  job and exits on the spot, in the middle of an optimizer step. The peer instead stops
  cleanly (the leader writes its checkpoint), and only then hands the signal to submitit,
  which requeues the job; the requeued peer resumes from the checkpoint.
"""

import atexit
import dataclasses
import os
import signal

from omegaconf import OmegaConf

from examples.common.workers import exit_now

# submitit's name for the variable that chooses its preemption signal (USR2 by default).
PREEMPT_SIGNAL_VARIABLE = "SUBMITIT_PREEMPT_SIGNAL"


@dataclasses.dataclass(frozen=True)
class Launch:
    """Where this process runs, as the job scheduler describes it."""

    scheduler: str  # "slurm" or "local" (submitit's local executor)
    job_id: str  # "<array job>_<array task>" for an array element
    global_rank: int = 0  # task within the job
    local_rank: int = 0  # task within this node
    num_tasks: int = 1
    num_nodes: int = 1

    @property
    def tasks_per_node(self):
        return max(1, self.num_tasks // max(1, self.num_nodes))


def current_launch(environ=None):
    """The Launch of this process, or None when neither submitit nor Slurm started it.

    submitit sets SUBMITIT_EXECUTOR in the jobs it starts and its JobEnvironment reads the
    scheduler's variables; a peer started by a plain `srun` has only SLURM_* variables.
    """
    environ = os.environ if environ is None else environ
    executor = environ.get("SUBMITIT_EXECUTOR", "")
    if executor and environ is os.environ:
        import submitit  # only here: it is not needed outside a job

        try:
            env = submitit.JobEnvironment()
        except RuntimeError:  # an executor that submitit has no plugin for
            env = None
        if env is not None:
            return Launch(
                scheduler=env.cluster,
                job_id=str(env.job_id),
                global_rank=env.global_rank,
                local_rank=env.local_rank,
                num_tasks=env.num_tasks,
                num_nodes=env.num_nodes,
            )
    if executor == "local" and "SUBMITIT_LOCAL_JOB_ID" in environ:
        return Launch(
            scheduler="local",
            job_id=environ["SUBMITIT_LOCAL_JOB_ID"],
            global_rank=int(environ.get("SUBMITIT_LOCAL_GLOBALID", 0)),
            local_rank=int(environ.get("SUBMITIT_LOCAL_LOCALID", 0)),
            num_tasks=int(environ.get("SUBMITIT_LOCAL_NTASKS", 1)),
            num_nodes=1,
        )
    if "SLURM_JOB_ID" in environ:
        job_id = environ["SLURM_JOB_ID"]
        if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
            job_id = f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
        return Launch(
            scheduler="slurm",
            job_id=job_id,
            global_rank=int(environ.get("SLURM_PROCID", 0)),
            local_rank=int(environ.get("SLURM_LOCALID", 0)),
            num_tasks=int(environ.get("SLURM_NTASKS", 1)),
            num_nodes=int(environ.get("SLURM_JOB_NUM_NODES", 1)),
        )
    return None


def check_peer(peer):
    """The peer index as an int, or None when not set (null or -1); ValueError when invalid."""
    if peer is None or peer == -1:
        return None
    if not isinstance(peer, int) or isinstance(peer, bool) or peer < 0:
        raise ValueError(
            f"peer must be a peer index (0, 1, ...; null for a single peer), got {peer!r}"
        )
    return peer


def check_launcher(peer):
    """Refuse `-m peer=range(N)` with Hydra's basic launcher, which runs one peer after another."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if peer is None or not HydraConfig.initialized():
        return
    hydra_config = HydraConfig.get()
    if hydra_config.mode == RunMode.MULTIRUN and "BasicLauncher" in hydra_config.launcher._target_:
        raise ValueError(
            "peer= with -m needs a launcher that starts the peers at the same time: add "
            "hydra/launcher=local (this machine) or hydra/launcher=slurm"
        )


def peer_name(peer, launch):
    """local_name for a peer that was not given one, or None to keep the HOSTNAME-PID default."""
    suffix = ""
    if launch is not None and launch.num_tasks > 1:
        # Several peers in one job (srun -n N, tasks_per_node > 1) share its id and peer index.
        suffix = f"-{launch.global_rank}"
    if peer is not None:
        return f"peer{peer}{suffix}"
    if launch is not None:
        return f"{launch.scheduler}-{launch.job_id}{suffix}"
    return None


def gpu_slot(peer, launch):
    """Which of the visible GPUs this peer takes with device=auto."""
    if launch is not None and launch.tasks_per_node > 1:
        return launch.local_rank
    # One task per job: Slurm shows each job only its own GPUs, but jobs of the local executor
    # all see the same ones, and the peer index spreads them.
    return peer or 0


def auto_device(peer, launch, gpu_count):
    if gpu_count <= 0:
        return "cpu"
    return f"cuda:{gpu_slot(peer, launch) % gpu_count}"


def assign_identity(flags, launch=None, gpu_count=None):
    """Fill in local_name, localdir and device of `flags` (a DictConfig) for this peer.

    Keys set on the command line win: an explicit local_name is kept, and device is only
    chosen when it is `auto`. A localdir given as a plain path (not the default
    `${savedir}/peers/${local_name}`) gets a folder per peer below it when `peer` is set,
    so that peers of one sweep never write to the same logs.tsv. Returns the launch used.
    """
    peer = check_peer(flags.get("peer"))
    check_launcher(peer)
    if launch is None:
        launch = current_launch()
    if not flags.local_name:
        name = peer_name(peer, launch)
        if name is not None:
            flags.local_name = name
    if peer is not None and not OmegaConf.is_interpolation(flags, "localdir"):
        flags.localdir = os.path.join(flags.localdir, flags.local_name)
    if flags.device == "auto":
        if gpu_count is None:
            gpu_count = visible_gpu_count()
        flags.device = auto_device(peer, launch, gpu_count)
    return launch


def visible_gpu_count():
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# submitit's local executor shows its jobs only the first gpus_per_node GPUs (none by default):
# hydra/launcher=local sets gpus_per_node=${gpu_count:}, all of this machine's.
OmegaConf.register_new_resolver("gpu_count", visible_gpu_count, replace=True)


def preemption_signal():
    """The signal submitit and our Slurm settings use before a time limit or a preemption."""
    name = os.environ.get(PREEMPT_SIGNAL_VARIABLE, "USR2")
    sig = getattr(signal, f"SIG{name}", None)
    if not isinstance(sig, signal.Signals):
        raise ValueError(f"{PREEMPT_SIGNAL_VARIABLE}={name} is not a signal name (e.g. USR2)")
    return sig


class Preemption:
    """Turns the preemption signal into a clean stop, then lets submitit requeue the job.

        preemption = Preemption()             # before the EnvPool forks its workers
        envs = moolib.EnvPool(...)
        stop = []
        preemption.connect(stop.append)       # stop.append(reason) once the signal comes
        ... training loop, until stop ...
        ... write the checkpoint, free the EnvPool and every moolib object ...
        preemption.requeue_if_signalled()     # under submitit: requeues the job and exits

    Create it before anything forks: Slurm sends the signal to every process of the job step,
    EnvPool workers included, and a worker that kept the default action would die of it; with
    this handler inherited, a worker only notes the signal in its own memory and goes on
    stepping, and the main process stops them when it stops. A signal that comes before
    `connect` is kept and passed on there.

    Without submitit (a plain srun, or sbatch --signal=USR2@120) the signal only stops the peer:
    the checkpoint is written, and Slurm's --requeue brings the job back if the cluster does so.
    """

    def __init__(self):
        self.signum = None
        self._on_signal = None
        self._pid = os.getpid()
        self._signal = preemption_signal()
        previous = signal.getsignal(self._signal)
        # submitit installs a bound method of its SignalHandler; anything else is not its.
        owner = getattr(previous, "__self__", None)
        self._submitit_handler = previous if type(owner).__module__.startswith("submitit") else None
        signal.signal(self._signal, self._handle)

    def connect(self, on_signal):
        self._on_signal = on_signal
        if self.signum is not None:
            on_signal(self.reason)

    @property
    def reason(self):
        return f"{signal.Signals(self.signum).name}: time limit or preemption"

    def _handle(self, signum, _frame):
        if os.getpid() != self._pid or self.signum is not None:
            return  # a forked worker, or the signal again
        self.signum = signum
        if self._on_signal is not None:
            self._on_signal(self.reason)

    @property
    def will_requeue(self):
        return self.signum is not None and self._submitit_handler is not None

    def requeue_if_signalled(self):
        """Call after the peer has stopped and freed its moolib objects. Under submitit, after
        the signal, this requeues the job and exits (SystemExit); otherwise it returns."""
        if not self.will_requeue:
            return
        name = signal.Signals(self.signum).name
        print(f"Handing {name} to submitit to requeue the job", flush=True)
        self._submitit_handler(self.signum, None)


def skip_teardown_once_submitit_has_the_result():
    """Under submitit (Slurm, or its local executor) the job's process is submitit's: it calls
    the experiment, saves what it returned, then exits the normal way, and moolib can crash that
    exit's teardown (SIGSEGV after "Job completed successfully", seen in about one exit of
    twenty), which Slurm records as a failed job. Call once the peer has stopped: from then on
    the process leaves at once, with status 0, if submitit has saved a result; without one
    (submitit could not save it, or requeued the job) the exit goes on as before."""
    if "SUBMITIT_FOLDER" not in os.environ:
        return
    import submitit

    result = submitit.JobEnvironment().paths.result_pickle
    atexit.register(lambda: result.exists() and exit_now(0))
