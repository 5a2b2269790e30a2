"""A2C on CartPole with moolib: the model, the loss and the training loop in this file.

    python examples/a2c.py                       # trains, writes logs.tsv in the working directory
    python examples/a2c.py --connect HOST:PORT   # joins another a2c run and shares its gradients

Environments run in worker processes through moolib.EnvPool, by default two batches in turn so that
one batch steps while the model acts on the other. Gradients go through a moolib.Accumulator: on
its own the run talks to a broker inside this process; with --connect, every process joined to
the same broker trains one shared model.

This file shares code openly with the V-trace agent, from examples/common: the gymnasium adapter
for EnvPool (envs.py), the TSV log (tsvlog.py), the HOST:PORT checks (address.py) and the guard
that keeps a dead or signalled env worker from hanging the loop (workers.py). None of them is
about moolib's training API, and each has one home so that both agents get its fixes. Every
moolib call (EnvPool, Broker, Group, Accumulator) stays here, in `main` and `train`.
"""

import argparse
import math
import signal
import sys
import time
from collections import deque

import moolib
import torch
from torch import nn
from torch.nn import functional as F

from examples.common.address import parse_address, with_free_port
from examples.common.envs import EnvFactory, check_env_name
from examples.common.tsvlog import TsvLog
from examples.common.workers import EnvWorkerDied, EnvWorkers, exit_now


def positive_int(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def positive_float(text):
    value = float(text)
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def mean(values):
    return sum(values) / len(values) if values else math.nan


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="A2C with moolib's EnvPool, Broker and Accumulator.")
    p.add_argument("--env", default="CartPole-v1", help="gymnasium env id with discrete actions")
    p.add_argument("--total-steps", type=positive_int, default=200_000, help="env steps to train")
    p.add_argument("--batch-size", type=positive_int, default=8, help="envs stepped at once")
    p.add_argument("--unroll-length", type=positive_int, default=5, help="steps per rollout")
    # CartPole steps in microseconds: one worker process keeps up, and on a small machine a
    # second one only competes with the learner for the cores. Raise it for costly envs.
    p.add_argument("--num-processes", type=positive_int, default=1, help="EnvPool processes")
    p.add_argument(
        "--num-batches",
        type=positive_int,
        default=2,
        help="env batches stepped in turn: the model acts on one while the others step",
    )
    p.add_argument(
        "--virtual-batch-size",
        type=positive_int,
        default=None,
        help="least samples per optimizer step, over all peers (default: one rollout)",
    )
    p.add_argument(
        "--lr", type=positive_float, default=None, help="default: 2e-3, or 4e-3 with --no-lstm"
    )
    p.add_argument(
        "--constant-lr", action="store_true", help="no linear decay of the learning rate to 0"
    )
    p.add_argument("--discounting", type=float, default=0.99)
    p.add_argument("--baseline-cost", type=float, default=0.5)
    p.add_argument("--entropy-cost", type=float, default=0.01)
    p.add_argument("--grad-norm-clipping", type=positive_float, default=1.0)
    p.add_argument("--hidden-size", type=positive_int, default=64)
    p.add_argument("--no-lstm", action="store_true", help="feed-forward core instead of an LSTM")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--logfile", default="logs.tsv")
    p.add_argument("--log-interval", type=positive_float, default=5.0, help="progress every N s")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--address", default="127.0.0.1:0",
                       help="where this run's own broker listens (port 0: any free port). "
                       "Loopback by default: moolib has no authentication")  # fmt: skip
    group.add_argument("--connect", default=None, help="HOST:PORT of a running broker to join")
    args = p.parse_args(argv)
    try:
        check_env_name(args.env)
        if args.connect:
            parse_address(args.connect)
        else:
            args.address = with_free_port(args.address)
    except (ValueError, OSError) as e:
        p.error(str(e))
    if args.lr is None:
        # Measured on CartPole: the MLP needs the larger rate to learn as fast as the LSTM does.
        args.lr = 4e-3 if args.no_lstm else 2e-3
    if not 0 <= args.discounting <= 1:
        p.error(f"--discounting must be in [0, 1], got {args.discounting}")
    return args


class Policy(nn.Module):
    """MLP torso, optional LSTM core, policy and value heads. Inputs are time-major [T, B, ...]."""

    def __init__(self, obs_size, num_actions, hidden_size, use_lstm):
        super().__init__()
        self.torso = nn.Sequential(
            nn.Linear(obs_size, hidden_size), nn.Tanh(),
            nn.Linear(hidden_size, hidden_size), nn.Tanh(),
        )  # fmt: skip
        self.core = nn.LSTMCell(hidden_size, hidden_size) if use_lstm else None
        # The heads see the torso's features next to the LSTM's: the policy can act on the
        # current observation from the start, while the memory becomes useful.
        head_size = 2 * hidden_size if use_lstm else hidden_size
        self.policy = nn.Linear(head_size, num_actions)
        self.baseline = nn.Linear(head_size, 1)
        self.hidden_size = hidden_size

    def initial_state(self, batch_size):
        if self.core is None:
            return ()
        return tuple(torch.zeros(batch_size, self.hidden_size) for _ in range(2))

    def forward(self, obs, done, core_state):
        T, B = done.shape
        x = self.torso(obs.reshape(T * B, -1).float()).view(T, B, -1)
        if self.core is not None:
            outputs = []
            for t in range(T):
                # done[t] marks obs[t] as the first of a new episode: forget the old one.
                keep = (~done[t]).float().unsqueeze(-1)
                core_state = self.core(x[t], tuple(s * keep for s in core_state))
                outputs.append(core_state[0])
            x = torch.cat([x, torch.stack(outputs)], dim=-1)
        return self.policy(x), self.baseline(x).squeeze(-1), core_state


def a2c_loss(logits, values, actions, rewards, done, discounting, baseline_cost, entropy_cost):
    """A2C loss on a rollout of T+1 steps, all tensors time-major [T+1, B, ...].

    Step t holds the observation's outputs (logits, values), the action taken from it, and the
    reward and done that led to it. Returns are n-step, bootstrapped from the value of the last
    step and cut at episode ends.
    """
    with torch.no_grad():
        returns = torch.empty_like(values[:-1])
        ret = values[-1]
        for t in reversed(range(returns.shape[0])):
            ret = rewards[t + 1] + discounting * (~done[t + 1]).float() * ret
            returns[t] = ret
    advantages = returns - values[:-1]
    log_probs = F.log_softmax(logits[:-1], dim=-1)
    action_log_probs = log_probs.gather(-1, actions[:-1].unsqueeze(-1)).squeeze(-1)
    pg_loss = -(action_log_probs * advantages.detach()).mean()
    baseline_loss = 0.5 * advantages.pow(2).mean()
    entropy_loss = (log_probs.exp() * log_probs).sum(-1).mean()  # negative entropy
    total = pg_loss + baseline_cost * baseline_loss + entropy_cost * entropy_loss
    stats = {"pg_loss": pg_loss.item(), "baseline_loss": baseline_loss.item(),
             "entropy_loss": entropy_loss.item()}  # fmt: skip
    return total, stats


class Rollout:
    """The last T+1 steps of one batch of envs, and the core state before the first of them."""

    def __init__(self, unroll_length, core_state):
        self.length = unroll_length + 1
        self.steps = []
        self.core_state = core_state

    def append(self, step, core_state_before):
        if not self.steps:
            self.core_state = core_state_before
        self.steps.append(step)

    def full(self):
        return len(self.steps) == self.length

    def stacked(self):
        return {key: torch.stack([s[key] for s in self.steps]) for key in self.steps[0]}

    def restart(self, core_state_before_last):
        # The last step of this rollout is the first of the next, so no transition is lost.
        self.steps = self.steps[-1:]
        self.core_state = core_state_before_last


def catch_stop_signals():
    """Ctrl-C and SIGTERM end the loop at its next turn: a KeyboardInterrupt raised inside one of
    moolib's calls back into Python can be lost there. Returns the list the handlers append to."""
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _: stop.append(signal.Signals(signum).name))
    return stop


def make_env_factory(args):
    env_factory = EnvFactory(args.env, seed=args.seed * 10_000)
    observation_space, action_space = env_factory.spaces()
    if not hasattr(action_space, "n") or len(observation_space.shape) != 1:
        sys.exit(f"a2c.py: error: {args.env} needs discrete actions and flat observations")
    return env_factory, observation_space.shape[0], action_space.n


class Progress:
    """Episode returns, the log rows and the progress lines."""

    def __init__(self, args, log):
        self.args, self.log = args, log
        self.episode_returns = torch.zeros(args.num_batches, args.batch_size)
        self.finished = deque(maxlen=100)  # for the progress line
        self.new_returns = []  # episodes finished since the last log row
        self.dropped_rollouts = 0  # since the last log row
        self.steps = 0
        self.start = self.last_print = time.monotonic()
        self.steps_at_last_print = 0

    def env_step(self, batch, reward, done):
        self.steps += self.args.batch_size
        self.episode_returns[batch] += reward
        for ret in self.episode_returns[batch][done].tolist():
            self.finished.append(ret)
            self.new_returns.append(ret)
        self.episode_returns[batch][done] = 0

    def row(self, **columns):
        now = time.monotonic()
        self.log.write({
            "step": self.steps,
            "mean_episode_return": mean(self.new_returns),
            "episodes": len(self.new_returns),
            **columns,
            "dropped_rollouts": self.dropped_rollouts,
            "time": now - self.start,
            "SPS": self.steps / max(now - self.start, 1e-9),
        })  # fmt: skip
        self.new_returns, self.dropped_rollouts = [], 0

    def maybe_print(self, model_version, peers):
        now = time.monotonic()
        if now - self.last_print >= self.args.log_interval:
            sps = (self.steps - self.steps_at_last_print) / (now - self.last_print)
            print(
                f"step {self.steps:>8d} | SPS {sps:6.0f} | return (last 100) "
                f"{mean(self.finished):6.1f} | updates {model_version} | peers {peers}",
                flush=True,
            )
            self.last_print, self.steps_at_last_print = now, self.steps

    def summary(self, stop):
        elapsed = time.monotonic() - self.start
        reason = f"stopped by {stop[0]}" if stop else "done"
        return (
            f"{reason}: {self.steps} steps in {elapsed:.0f} s "
            f"({self.steps / max(elapsed, 1e-9):.0f} SPS), mean return of the last "
            f"{len(self.finished)} episodes {mean(self.finished):.1f}; log: {self.log.path}"
        )


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    # Tiny model, two cores: more torch threads only contend with the env processes.
    torch.set_num_threads(1)
    stop = catch_stop_signals()

    # EnvPool forks its workers, and moolib refuses to fork once it has started threads: create it
    # before any Rpc. Forked inside workers.forking(), the workers leave signals to this process.
    env_factory, obs_size, num_actions = make_env_factory(args)
    workers = EnvWorkers(env_factory, args.num_processes)
    with workers.forking():
        envs = moolib.EnvPool(
            workers.create_env,
            num_processes=args.num_processes,
            batch_size=args.batch_size,
            num_batches=args.num_batches,
        )

    model = Policy(obs_size, num_actions, args.hidden_size, not args.no_lstm)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, fused=True)
    model.zero_grad(set_to_none=False)  # the Accumulator needs every .grad to exist

    rpc = moolib.Rpc()
    rpc.set_name(f"a2c-{moolib.create_uid()}")
    broker = broker_rpc = None
    broker_address = args.connect
    if not args.connect:
        # The broker needs an Rpc of its own: peers look for it by the name "broker".
        broker_rpc = moolib.Rpc()
        broker = moolib.Broker(broker_rpc)
        broker_rpc.set_name("broker")
        broker_rpc.listen(args.address)
        broker_address = args.address
        print(f"Broker listening at {args.address}; join with --connect {args.address}")
    group = moolib.Group(rpc, f"a2c-{args.env}")
    accumulator = moolib.Accumulator("model", model.parameters(), model.buffers(), group=group)
    accumulator.set_virtual_batch_size(
        args.virtual_batch_size or args.batch_size * args.unroll_length
    )
    rpc.connect(broker_address)

    log = TsvLog(args.logfile)
    print(f"Logging to {log.path}")
    progress = Progress(args, log)
    try:
        train(args, envs, workers, model, optimizer, broker, group, accumulator, progress, stop)
    except EnvWorkerDied as e:
        log.close()
        print(f"a2c.py: error: {e}; stopping", file=sys.stderr)
        exit_now(1)  # a thread still waits on the dead worker: see exit_now
    finally:
        log.close()
    print(progress.summary(stop))
    # Exit here, not by returning: a return frees main's locals, moolib's objects among them,
    # and a process that had just joined a group crashed with SIGSEGV after "done" in full test
    # runs (about one exit in twenty) when that was the only work left. exit_now also skips
    # the interpreter's teardown, which moolib's objects could crash the same way.
    exit_now(0)


@torch.inference_mode()
def act(model, env_out, core_state):
    """Sample actions for one batch of envs ([B] from a [1, B] step); returns them and the core
    state after the step."""
    logits, _, core_after = model(env_out["state"][None], env_out["done"][None], core_state)
    return torch.multinomial(F.softmax(logits[0], dim=-1), 1).squeeze(-1), core_after


def learner_state(model, optimizer, schedule):
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "schedule": schedule}


def load_learner_state(state, model, optimizer):
    """Take the leader's learner state; returns its learning-rate schedule."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return {"trained": 0, **state["schedule"]}


def backward(args, model, rollout, initial_core):
    """Fill every .grad with the gradients of the A2C loss on one rollout; returns the losses."""
    logits, values, _ = model(rollout["state"], rollout["done"], initial_core)
    loss, losses = a2c_loss(
        logits, values, rollout["action"], rollout["reward"], rollout["done"],
        args.discounting, args.baseline_cost, args.entropy_cost,
    )  # fmt: skip
    model.zero_grad(set_to_none=False)
    loss.backward()
    return losses


def optimizer_step(args, model, optimizer, schedule, reduced):
    """A step on the group's reduced gradients of `reduced` samples; returns the gradient norm.
    The learning rate decays with the samples the group has reduced (the same count on every
    peer), whatever the virtual batch size and however many peers join."""
    schedule["trained"] += reduced
    if schedule["decay_steps"]:
        fraction = schedule["trained"] / schedule["decay_steps"]
        optimizer.param_groups[0]["lr"] = schedule["lr"] * max(0.0, 1.0 - fraction)
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), args.grad_norm_clipping)
    optimizer.step()
    return grad_norm.item()


def train(args, envs, workers, model, optimizer, broker, group, accumulator, progress, stop):
    rollout_size = args.batch_size * args.unroll_length
    schedule = {"lr": args.lr, "decay_steps": None if args.constant_lr else args.total_steps,
                "trained": 0}  # fmt: skip
    core_states = [model.initial_state(args.batch_size) for _ in range(args.num_batches)]
    rollouts = [Rollout(args.unroll_length, core_states[i]) for i in range(args.num_batches)]
    # Per batch: a finished rollout waiting for the Accumulator to want gradients.
    pending = [None] * args.num_batches
    no_action = torch.zeros(args.batch_size, dtype=torch.int64)
    futures = [envs.step(i, no_action) for i in range(args.num_batches)]
    # NaN until this peer learns from a rollout: a newcomer may step on others' gradients first.
    losses = dict.fromkeys(["pg_loss", "baseline_loss", "entropy_loss"], math.nan)
    last_wait_note = time.monotonic()  # say nothing unless the wait lasts
    batch = 0

    while progress.steps < args.total_steps and not stop:
        if broker is not None:
            broker.update()
        group.update()
        accumulator.update()
        if not accumulator.connected():
            if time.monotonic() - last_wait_note > 5:
                print(f"Waiting for the broker at {args.connect or args.address} ...")
                last_wait_note = time.monotonic()
            time.sleep(0.01)
            continue

        # A newcomer gets the whole learner state from the group's leader: weights as well as
        # optimizer, so that it cannot start one step out of line with the others, and the
        # learning-rate schedule, so that all peers step with the same rate.
        if accumulator.wants_state():
            accumulator.set_state(learner_state(model, optimizer, schedule))
        if accumulator.has_new_state():
            schedule = load_learner_state(accumulator.state(), model, optimizer)

        # Act on one batch of envs while the other batches step in the worker processes.
        # Copy out: the result lives in shared memory that the next step of this batch reuses.
        env_out = {key: value.clone() for key, value in workers.result(futures[batch]).items()}
        action, core_after = act(model, env_out, core_states[batch])
        futures[batch] = envs.step(batch, action)
        rollouts[batch].append(
            {"state": env_out["state"], "done": env_out["done"],
             "reward": env_out["reward"], "action": action},
            core_states[batch],
        )  # fmt: skip
        core_before = core_states[batch]
        core_states[batch] = core_after
        progress.env_step(batch, env_out["reward"], env_out["done"])

        if rollouts[batch].full():
            if pending[batch] is not None:  # never learned from: the learner lags the actors
                progress.dropped_rollouts += 1
            pending[batch] = (rollouts[batch].stacked(), rollouts[batch].core_state)
            rollouts[batch].restart(core_before)

        # Gradients: computed on a finished rollout whenever the Accumulator takes them; the
        # reduction then runs in the background while acting goes on. With nothing to give, say
        # so (moolib's contract): the other peers' reduction then need not wait for this one.
        if accumulator.wants_gradients():
            ready = [i for i, p in enumerate(pending) if p is not None]
            if ready:
                losses = backward(args, model, *pending[ready[0]])
                pending[ready[0]] = None
                accumulator.reduce_gradients(rollout_size)
            else:
                accumulator.skip_gradients()

        if accumulator.has_gradients():
            reduced = accumulator.get_gradient_stats()["batch_size"]
            grad_norm = optimizer_step(args, model, optimizer, schedule, reduced)
            accumulator.zero_gradients()
            progress.row(
                model_version=accumulator.model_version(), **losses,
                grad_norm=grad_norm, lr=optimizer.param_groups[0]["lr"],
                virtual_batch_size=reduced, peers=len(group.members()),
            )  # fmt: skip
        progress.maybe_print(accumulator.model_version(), len(group.members()))
        batch = (batch + 1) % args.num_batches


if __name__ == "__main__":
    main()  # exits through exit_now
