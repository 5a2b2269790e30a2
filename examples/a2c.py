"""A2C on CartPole with moolib, in one file.

    python examples/a2c.py                       # trains, writes logs.tsv in the working directory
    python examples/a2c.py --connect HOST:PORT   # joins another a2c run and shares its gradients

Environments run in worker processes through moolib.EnvPool, by default two batches in turn so that
one batch steps while the model acts on the other. Gradients go through a moolib.Accumulator: on
its own the run talks to a broker inside this process; with --connect, every process joined to
the same broker trains one shared model.
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


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    # Tiny model, two cores: more torch threads only contend with the env processes.
    torch.set_num_threads(1)

    # EnvPool forks its workers, and moolib refuses to fork once it has started threads: create it
    # before any Rpc.
    env_factory = EnvFactory(args.env, seed=args.seed * 10_000)
    observation_space, action_space = env_factory.spaces()
    if not hasattr(action_space, "n") or len(observation_space.shape) != 1:
        sys.exit(f"a2c.py: error: {args.env} needs discrete actions and flat observations")
    envs = moolib.EnvPool(
        env_factory,
        num_processes=args.num_processes,
        batch_size=args.batch_size,
        num_batches=args.num_batches,
    )

    model = Policy(observation_space.shape[0], action_space.n, args.hidden_size, not args.no_lstm)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, fused=True)
    model.zero_grad(set_to_none=False)  # the Accumulator needs every .grad to exist

    rpc = moolib.Rpc()
    rpc.set_name(f"a2c-{moolib.create_uid()}")
    broker = broker_rpc = None
    if args.connect:
        broker_address = args.connect
    else:
        # The broker needs an Rpc of its own: peers look for it by the name "broker".
        broker_rpc = moolib.Rpc()
        broker = moolib.Broker(broker_rpc)
        broker_rpc.set_name("broker")
        broker_rpc.listen(args.address)
        broker_address = args.address
        print(f"Broker listening at {args.address}; join with --connect {args.address}")
    group = moolib.Group(rpc, f"a2c-{args.env}")
    accumulator = moolib.Accumulator("model", model.parameters(), model.buffers(), group=group)
    rollout_size = args.batch_size * args.unroll_length
    accumulator.set_virtual_batch_size(args.virtual_batch_size or rollout_size)
    rpc.connect(broker_address)

    schedule = {"lr": args.lr, "decay_steps": None if args.constant_lr else args.total_steps}
    log = TsvLog(args.logfile)
    print(f"Logging to {log.path}")
    stop = []
    # Ctrl-C and SIGTERM end the loop at its next turn: a KeyboardInterrupt raised inside one of
    # moolib's calls back into Python can be lost there.
    signal.signal(signal.SIGINT, lambda *_: stop.append("Ctrl-C"))
    signal.signal(signal.SIGTERM, lambda *_: stop.append("SIGTERM"))

    core_states = [model.initial_state(args.batch_size) for _ in range(args.num_batches)]
    rollouts = [Rollout(args.unroll_length, core_states[i]) for i in range(args.num_batches)]
    # Per batch: a finished rollout waiting for the Accumulator to want gradients.
    pending = [None] * args.num_batches
    episode_returns = torch.zeros(args.num_batches, args.batch_size)
    finished_returns = deque(maxlen=100)  # for the progress line
    new_returns = []  # episodes finished since the last log row
    futures = [
        envs.step(i, torch.zeros(args.batch_size, dtype=torch.int64))
        for i in range(args.num_batches)
    ]
    steps = 0
    losses = {}
    start = last_print = time.monotonic()
    steps_at_last_print = 0
    last_wait_note = time.monotonic()  # say nothing unless the wait lasts
    batch = 0

    try:
        while steps < args.total_steps and not stop:
            if broker is not None:
                broker.update()
            group.update()
            accumulator.update()
            if not accumulator.connected():
                if time.monotonic() - last_wait_note > 5:
                    print(f"Waiting for the broker at {broker_address} ...")
                    last_wait_note = time.monotonic()
                time.sleep(0.01)
                continue

            # A newcomer gets the whole learner state from the group's leader: weights as well
            # as optimizer, so that it cannot start one step out of line with the others, and
            # the learning-rate schedule, so that all peers step with the same rate.
            if accumulator.wants_state():
                accumulator.set_state(
                    {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "schedule": schedule}
                )  # fmt: skip
            if accumulator.has_new_state():
                state = accumulator.state()
                model.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
                schedule = state["schedule"]

            # Act on one batch of envs while the other batches step in the worker processes.
            # Copy out: the result lives in shared memory that the next step of this batch reuses.
            env_out = {key: value.clone() for key, value in futures[batch].result().items()}
            with torch.inference_mode():
                obs = env_out["state"].unsqueeze(0)
                done = env_out["done"].unsqueeze(0)
                logits, _, core_after = model(obs, done, core_states[batch])
                action = torch.multinomial(F.softmax(logits[0], dim=-1), 1).squeeze(-1)
            futures[batch] = envs.step(batch, action)
            rollouts[batch].append(
                {"state": env_out["state"], "done": env_out["done"],
                 "reward": env_out["reward"], "action": action},
                core_states[batch],
            )  # fmt: skip
            core_before = core_states[batch]
            core_states[batch] = core_after
            steps += args.batch_size

            episode_returns[batch] += env_out["reward"]
            for ret in episode_returns[batch][env_out["done"]].tolist():
                finished_returns.append(ret)
                new_returns.append(ret)
            episode_returns[batch][env_out["done"]] = 0

            if rollouts[batch].full():
                pending[batch] = (rollouts[batch].stacked(), rollouts[batch].core_state)
                rollouts[batch].restart(core_before)

            # Gradients: computed on a finished rollout whenever the Accumulator takes them; the
            # reduction then runs in the background while acting goes on.
            ready = [p for p in pending if p is not None]
            if ready and accumulator.wants_gradients():
                rollout, initial_core = ready[0]
                pending[pending.index(ready[0])] = None
                logits, values, _ = model(rollout["state"], rollout["done"], initial_core)
                loss, losses = a2c_loss(
                    logits, values, rollout["action"], rollout["reward"], rollout["done"],
                    args.discounting, args.baseline_cost, args.entropy_cost,
                )  # fmt: skip
                model.zero_grad(set_to_none=False)
                loss.backward()
                accumulator.reduce_gradients(rollout_size)

            if accumulator.has_gradients():
                if schedule["decay_steps"]:
                    # By model version, which all peers share: identical rates, identical weights.
                    progress = accumulator.model_version() * rollout_size / schedule["decay_steps"]
                    optimizer.param_groups[0]["lr"] = schedule["lr"] * max(0.0, 1.0 - progress)
                grad_norm = nn.utils.clip_grad_norm_(model.parameters(), args.grad_norm_clipping)
                optimizer.step()
                accumulator.zero_gradients()
                now = time.monotonic()
                log.write({
                    "step": steps,
                    "model_version": accumulator.model_version(),
                    "mean_episode_return": mean(new_returns),
                    "episodes": len(new_returns),
                    **losses,
                    "grad_norm": grad_norm.item(),
                    "virtual_batch_size": accumulator.get_gradient_stats()["batch_size"],
                    "peers": len(group.members()),
                    "time": now - start,
                    "SPS": steps / max(now - start, 1e-9),
                })  # fmt: skip
                new_returns = []

            now = time.monotonic()
            if now - last_print >= args.log_interval:
                recent = mean(finished_returns)
                sps = (steps - steps_at_last_print) / (now - last_print)
                print(
                    f"step {steps:>8d} | SPS {sps:6.0f} | return (last 100) {recent:6.1f} | "
                    f"updates {accumulator.model_version()} | peers {len(group.members())}",
                    flush=True,
                )
                last_print, steps_at_last_print = now, steps
            batch = (batch + 1) % args.num_batches
    finally:
        log.close()

    elapsed = time.monotonic() - start
    recent = mean(finished_returns)
    reason = f"stopped by {stop[0]}" if stop else "done"
    print(
        f"{reason}: {steps} steps in {elapsed:.0f} s ({steps / max(elapsed, 1e-9):.0f} SPS), "
        f"mean return of the last {len(finished_returns)} episodes {recent:.1f}; log: {log.path}"
    )
    # moolib's objects point at each other: free them newest first, not in Python's order.
    del accumulator, group, rpc, broker, broker_rpc
    return 0


if __name__ == "__main__":
    sys.exit(main())
