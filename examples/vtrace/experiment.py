"""V-trace (IMPALA) with moolib: one peer of an elastic, data-parallel training run.

    python -m moolib.broker
    python -m examples.vtrace.experiment connect=BROKER_IP:BROKER_PORT \\
        savedir=/tmp/moolib-atari/savedir project=moolib-atari group=Zaxxon-Breakout \\
        env.name=ALE/Breakout-v5

Every process started with the same entity/project/group joins the same moolib Group: peers add
their gradients through an Accumulator, a newcomer receives the leader's learner state, and the
leader writes checkpoints to savedir. Each peer logs to its own localdir/logs.tsv.

The loop in `train` is the whole algorithm, one named part per line: act on one batch of envs
while the others step in the EnvPool's worker processes (actor.py), queue finished unrolls for
the learner, compute gradients in a second thread and hand them to the Accumulator (learner.py),
step the optimizer when the group's reduced gradients arrive (optimizer.py), sum statistics over
the group, log (logs.py) and checkpoint (checkpoints.py).
"""

import os
import signal
import socket
import sys
import threading
import time
import zlib

import hydra
import moolib
import torch
from omegaconf import DictConfig

from examples.common.checkpoint import CheckpointError
from examples.common.envs import EnvFactory
from examples.common.stats import GroupStats
from examples.common.workers import EnvWorkerDied, EnvWorkers, exit_now
from examples.vtrace import cluster
from examples.vtrace.actor import Actor, LearnerQueue, use_acting_threads
from examples.vtrace.admission import Lobby
from examples.vtrace.checkpoints import Checkpointer, load_checkpoint
from examples.vtrace.command_line import check_command_line
from examples.vtrace.config import (
    ConfigError,
    ExperimentConfig,
    check_flags,
    check_writable,
    plain,
    resolve_device,
)
from examples.vtrace.learner import AsyncLearner, NonFiniteGradients
from examples.vtrace.logs import ProgressLog
from examples.vtrace.models import architecture, create_model
from examples.vtrace.optimizer import create_optimizer, step_optimizer
from examples.vtrace.state import LearnerState

# EnvPool's workers give up after two minutes without an action: act at least this often.
KEEP_ENVS_ALIVE_S = 30


def prepare(flags):
    """Check the settings and the folders; returns the torch device."""
    try:
        # Under a launcher (peer=, Slurm, submitit): local_name, localdir and device=auto.
        cluster.assign_identity(flags)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not flags.local_name:
        flags.local_name = f"{socket.gethostname()}-{os.getpid()}"
    check_flags(flags)
    device = resolve_device(flags.device)
    for key in ["savedir", "localdir"]:
        check_writable(flags[key], f"{key}={flags[key]}")
    torch.manual_seed(flags.seed)
    # Adam's second moments of rarely used weights decay into subnormal floats, which x86 cores
    # compute on about a hundred times slower: in MinAtar runs the optimizer step took 1.8 ms of
    # CPU instead of 0.5 (docs/results.md). Threads and processes made later inherit the flag.
    torch.set_flush_denormal(True)
    if flags.torch_threads > 0:
        # Intra-op threads that outnumber the free cores spin against the env processes.
        torch.set_num_threads(flags.torch_threads)
    return device


def create_envs(flags):
    """The EnvPool, the guard of its worker processes (workers.py) and the spaces of its envs."""
    env_factory = EnvFactory(
        flags.env.name,
        # Distinct episodes on every peer; the same ones again for the same seed and local_name.
        seed=flags.seed * 1_000_003 + zlib.crc32(flags.local_name.encode()),
        repeat_action_probability=flags.env.repeat_action_probability,
        num_action_repeats=flags.env.num_action_repeats,
        noop_max=flags.env.noop_max,
        full_action_space=flags.env.full_action_space,
        # Time-limit cuts come as a flagged last observation and a filler step (see envs.py):
        # the learner bootstraps from the last observation's value instead of taking it as 0.
        mark_truncation=True,
        mark_life_loss=flags.env.episodic_life,
    )
    observation_space, action_space = env_factory.spaces()
    if not hasattr(action_space, "n"):
        raise ConfigError(
            f"env.name: {flags.env.name} has {type(action_space).__name__} actions; "
            "this agent needs Discrete ones"
        )
    workers = EnvWorkers(env_factory, flags.num_actor_cpus, niceness=flags.env_worker_niceness)
    # Forked with SIGINT/SIGTERM blocked: a signal to the process group leaves the workers
    # stepping, and this process stops them when it is done.
    with workers.forking():
        envs = moolib.EnvPool(
            workers.create_env,
            num_processes=flags.num_actor_cpus,
            batch_size=flags.actor_batch_size,
            num_batches=flags.num_actor_batches,
        )
    return envs, workers, observation_space, action_space


def share_state(accumulator, state, learner):
    """A newcomer takes the leader's whole learner state, weights included."""
    if accumulator.wants_state():
        accumulator.set_state(state.state_dict())
    if accumulator.has_new_state():
        with learner.weights_lock:
            state.load_state_dict(accumulator.state())
        print(f"Received the learner state at model version {accumulator.model_version()}")


def stop_on_signals():
    """A list that SIGINT and SIGTERM append their names to: the loop ends at its next turn."""
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _: stop.append(signal.Signals(signum).name))
    return stop


def act(actor, queue, log, group_stats, model_version=0):
    """One step of the actor, by the weights of `model_version`; its finished unrolls go to the
    learner's queue (or are dropped and counted when the queue is full: acting only goes on then
    to keep the env workers alive)."""
    unrolls = actor.step(model_version)
    stats = actor.take_stats()
    log.add(stats)
    if group_stats is not None:  # None before the group is joined
        group_stats.add(stats)
    for unroll in unrolls:
        if queue.full():
            log.count("dropped_unrolls")
        else:
            queue.put(unroll, actor.group_size)


def act_is_due(envs_ready, queue, learner, since_last_act):
    """Whether to act this turn: not while learning lags behind by more than max_queued_batches
    batches (with 0: while the learner is still learning), nor while the next batch's envs are
    still stepping (the turn then hands the learner its next batch instead of waiting for them
    in act()); but always after KEEP_ENVS_ALIVE_S without acting."""
    if since_last_act >= KEEP_ENVS_ALIVE_S:
        return True
    return envs_ready and not queue.waits_for(learner)


def learn(flags, learner, accumulator, group, queue, state, log):
    """Hand the learner thread's gradients to the group, step the optimizer once the group's sum
    is in, and start the learner on its next minibatch, all in this turn of the loop when the
    sum comes at once (a lone peer's takes two accumulator updates): a hand-over that waited
    for the next turns, each with a step of acting, left the learner thread idle meanwhile.
    Returns the optimizer step's numbers, or None when there was no step."""
    alone = len(group.members()) == 1

    def hand_over_and_start():
        dropped = learner.update(
            accumulator, group.sync_id(), queue, alone=alone, env_train_steps=state.env_train_steps
        )
        log.count("dropped_batches", dropped)

    hand_over_and_start()
    log.count("nonfinite_batches", learner.take_nonfinite_count())
    for _ in range(2):
        if accumulator.has_gradients():
            break
        accumulator.update()
    if not accumulator.has_gradients():
        return None
    with learner.weights_lock:  # the learner thread may be copying them
        stats = step_optimizer(flags, state, accumulator)
    hand_over_and_start()
    return stats


def progress(state, accumulator, group, learner_stats):
    """The group's side of a log row; logs.py adds this peer's own numbers."""
    return {
        "step": state.env_train_steps,
        "env_train_steps": state.env_train_steps,
        "model_version": accumulator.model_version(),
        "global_mean_episode_return": state.global_stats.mean("episode_return"),
        "global_env_steps": state.global_stats.sum("env_steps"),
        "peers": len(group.members()),
        "is_leader": int(accumulator.is_leader()),
        "lr": state.optimizer.param_groups[0]["lr"],
        "skipped_steps": state.skipped_steps,
        **learner_stats,
    }


def enter_lobby(flags, model):
    """The broker connection, and this peer's place in its group's lobby (admission.py), where
    a peer whose model or settings do not fit the group's is refused."""
    rpc = moolib.Rpc()
    # TCP only, also between peers on one machine: the shared-memory transport's reactor thread
    # wakes some 3,000 times a second even in a lone peer, each time taking a core from the
    # learner or the acting thread (a MinAtar run made about 5% more env steps/s without it).
    rpc.set_transports(["tcp/ip"])
    rpc.set_name(flags.local_name)
    lobby = Lobby(rpc, group_name(flags), flags, model)
    rpc.connect(flags.connect)
    return rpc, lobby


def wait_for_admission(flags, lobby, actor, queue, log, stop):
    """Until the lobby lets this peer in (GroupMismatch if it does not fit), or a signal stops
    it; acting now and then keeps the env workers alive meanwhile."""
    last_act = time.monotonic()
    while not stop and not lobby.admitted(now := time.monotonic()):
        if not lobby.group.active():
            log.note_waiting(now, flags.connect)
        if now - last_act >= KEEP_ENVS_ALIVE_S:
            last_act = now
            act(actor, queue, log, None)
        time.sleep(0.05)


def join_group(flags, rpc, model, resumed_version):
    """The group and the Accumulator that shares the model's gradients."""
    group = moolib.Group(rpc, group_name(flags))
    accumulator = moolib.Accumulator("model", model.parameters(), model.buffers(), group=group)
    accumulator.set_virtual_batch_size(flags.virtual_batch_size)
    if resumed_version is not None:
        accumulator.set_model_version(resumed_version)
    return group, accumulator


def group_name(flags):
    return f"{flags.entity}/{flags.project}/{flags.group}"


def create_learner_state(flags, observation_space, action_space, device):
    """The model and its LearnerState, resumed from savedir/checkpoint.tar when there is one;
    returns (model, state, the checkpoint's model version or None)."""
    model = create_model(
        observation_space, action_space.n, precision=flags.precision, device=device,
        **architecture(flags),
    ).to(device)  # fmt: skip
    state = LearnerState(model, create_optimizer(flags, model))
    resumed_version = load_checkpoint(flags, state)
    if resumed_version is not None:
        print(f"Resumed from {flags.savedir}/checkpoint.tar at model version {resumed_version}")
    model.zero_grad(set_to_none=False)  # the Accumulator needs every .grad to exist
    return model, state, resumed_version


def train(flags, device, preemption=None):
    flags = plain(flags)
    # EnvPool forks its workers, and moolib refuses to fork once it has threads: it comes first.
    envs, workers, observation_space, action_space = create_envs(flags)
    model, state, resumed_version = create_learner_state(
        flags, observation_space, action_space, device
    )
    where = f"{group_name(flags)} on {device} ({model.precision}); logs in {flags.localdir}"
    print(f"Peer {flags.local_name} of {where}")
    # Set when the envs of a batch have stepped or the learner thread has finished a batch: the
    # loop's waits end then.
    wakeup = threading.Event()
    actor = Actor(flags, envs, model, device, workers, wakeup)
    queue = LearnerQueue(flags, device)
    learner = AsyncLearner(flags, model, wakeup)
    use_acting_threads(flags)
    start = time.monotonic()
    log = ProgressLog(flags, start)
    stop = stop_on_signals()
    if preemption is not None:
        preemption.connect(stop.append)
    rpc, lobby = enter_lobby(flags, model)
    wait_for_admission(flags, lobby, actor, queue, log, stop)
    group, accumulator = join_group(flags, rpc, model, resumed_version)
    last_act = time.monotonic()
    group_stats = GroupStats(group, flags.log_interval)
    checkpoints = Checkpointer(flags, start)
    optimizer_stats = {"grad_norm": float("nan"), "virtual_batch_size": 0}
    fatal = None  # why this peer must exit non-zero once it has stopped

    while not stop:
        group.update()
        accumulator.update()
        now = time.monotonic()
        lobby.update(now)
        if not accumulator.connected():
            log.note_waiting(now, flags.connect)
            time.sleep(0.05)
            if now - last_act < KEEP_ENVS_ALIVE_S:
                continue
        share_state(accumulator, state, learner)
        envs_ready = False
        try:
            envs_ready = actor.ready()
            if act_is_due(envs_ready, queue, learner, now - last_act):
                last_act = now
                act(actor, queue, log, group_stats, accumulator.model_version())
        except EnvWorkerDied as e:  # stop like on a signal, then exit non-zero
            fatal = f"{e}; restart this peer to resume"
            stop.append("an env worker died")
        try:
            if stepped := learn(flags, learner, accumulator, group, queue, state, log):
                optimizer_stats = stepped
        except NonFiniteGradients as e:
            fatal = str(e)
            stop.append("non-finite gradients")
        group_stats.update(state.global_stats, now)
        if state.env_train_steps >= flags.total_steps:
            stop.append(f"total_steps={flags.total_steps} reached")
        if log.due(now) or stop:
            learner_stats = {**optimizer_stats, **learner.losses,
                             "policy_lag": learner.take_policy_lag()}  # fmt: skip
            row = progress(state, accumulator, group, learner_stats)
            log.write(now, {**row, "time": now - start}, leader=accumulator.get_leader())
        checkpoints.update(now, state, accumulator)
        if queue.waits_for(learner) or not envs_ready:
            learner.wait(0.001)  # for the learner's gradients, the group's or the envs' step

    learner.close()
    checkpoints.final(state, accumulator)
    log.close()
    print(f"Stopped ({stop[0]}) at {state.env_train_steps} env steps trained, "
          f"model version {accumulator.model_version()}")  # fmt: skip
    if fatal is not None:
        print(f"experiment: error: {fatal}", file=sys.stderr)
        exit_now(1)  # a thread may still wait on a dead env worker: see workers.exit_now
    # moolib's objects point at each other: free them newest first, not in Python's order.
    del queue, accumulator, group, lobby, rpc
    return 0


@hydra.main(version_base=None, config_path=".", config_name="config")
def main(flags: DictConfig):
    # Before the EnvPool forks: its workers inherit the handler (see cluster.Preemption).
    preemption = cluster.Preemption()
    try:
        result = train(flags, prepare(flags), preemption)
    except (ConfigError, CheckpointError) as e:
        print(f"experiment: error: {e}", file=sys.stderr)
        sys.exit(2)
    # Only now, with the checkpoint written and train's moolib objects freed: under submitit,
    # after the preemption signal, this requeues the job and exits.
    preemption.requeue_if_signalled()
    cluster.skip_teardown_once_submitit_has_the_result()
    return result


if __name__ == "__main__":
    sys.argv[1:] = check_command_line("experiment", ExperimentConfig)
    main()
    # The checkpoint, the logs and moolib's objects are all done with by now. moolib can crash
    # the interpreter's own teardown (SIGSEGV after "Stopped", seen in about one exit of twenty),
    # so skip it. (Under submitit the job process returns normally, so its result is recorded.)
    exit_now(0)
