"""One peer of the network-scaling benchmark (bench/netscaling.py): the real moolib Rpc, Group and
Accumulator, holding the real model's parameters, with a stand-in learner that hands over
gradients without computing them, so that the two shared cores are left to the network.

    python -m bench.standin_peer --connect 10.215.0.1:4431 --group g --model resnet \\
        --batch-size 32 --peers 4 --learner-seconds 0 --stop-file /tmp/stop --out peer0.json

The stand-in learner behaves like examples/vtrace/learner.py towards the Accumulator: whenever
the Accumulator wants gradients it reduces one batch (at most one per optimizer step) if the
stand-in's "backward pass" is done, and skips otherwise. --learner-seconds is how long that pass
takes after the previous optimizer step (0: gradients are always ready, which measures the
reduction alone); it sleeps, so it uses no CPU. The optimizer step itself is left out.

`--broker ADDRESS` runs a moolib broker instead (in the hub's namespace); `--then-exec PROGRAM
ARGS...` runs PROGRAM, killed like the peers if the benchmark dies (the real-learner check).

Every optimizer step is recorded as (model version, time of the hand-over, time the reduced
gradients arrived) on CLOCK_MONOTONIC, which all namespaces share; the records are written to
--out as JSON when the stop file appears (or at --max-seconds).
"""

import argparse
import ctypes
import json
import os
import signal
import sys
import time

import gymnasium as gym
import numpy as np

# What the stand-in peers hold: the parameters of the examples' real models (no LSTM, as in
# config.py's default), for Atari frames (Pong's 6 actions) or MinAtar Breakout (3 actions).
MODELS = {
    "resnet": ((4, 84, 84), 6, "resnet"),
    "nature": ((4, 84, 84), 6, "nature"),
    "minatar": ((10, 10, 4), 3, "resnet"),
    "cartpole": ((4,), 2, "resnet"),
}
IDLE_SLEEP_S = 0.001  # a turn of the loop with nothing to do: 16 spinning peers would starve moolib


def die_with_parent():
    """SIGKILL this process when the benchmark that started it dies, even by SIGKILL."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent was gone before prctl
        sys.exit(1)


def model_parameters(name):
    import torch

    from examples.vtrace.models import create_model

    shape, actions, atari_net = MODELS[name]
    space = gym.spaces.Box(0, 255, shape, np.uint8)
    model = create_model(space, actions, use_lstm=False, atari_net=atari_net)
    # Gradients that are not zero, made once: the stand-in copies them in at every hand-over,
    # as the real learner copies its thread's gradients into .grad.
    fake = [torch.randn_like(p) * 1e-3 for p in model.parameters()]
    model.zero_grad(set_to_none=False)
    return model, fake


def run_broker(address, stop_file):
    import moolib

    rpc = moolib.Rpc()
    rpc.set_name("broker")
    broker = moolib.Broker(rpc)
    rpc.listen(address)
    print(f"Broker listening at {address}", flush=True)
    while not os.path.exists(stop_file):
        broker.update()
        time.sleep(0.25)


class StandInLearner:
    """Gradients that are 'computed' learner_seconds after the last optimizer step."""

    def __init__(self, model, fake, batch_size, learner_seconds, batches_per_step=1):
        self.model, self.fake = model, fake
        self.batch_size = batch_size
        self.learner_seconds = learner_seconds
        self.batches_per_step = batches_per_step
        self.ready_at = time.monotonic() + learner_seconds
        self.handed_in = (None, 0)  # (model version, batches handed in towards its next step)
        self.sync_id = None
        self.versions = []  # (time, model version) at every optimizer step

    def turn(self, accumulator, records, alone, sync_id):
        """One turn of the peer's loop; returns whether anything was done."""
        if sync_id != self.sync_id:
            # The group changed: moolib drops the reductions under way, so this peer's batches
            # of the step it was in count no more, as in examples/vtrace/learner.py.
            self.sync_id, self.handed_in = sync_id, (None, 0)
            if records and records[-1][1] is None:
                records.pop()
        version = accumulator.model_version()
        if accumulator.has_gradients():
            now = time.monotonic()
            if records and records[-1][1] is None and records[-1][2] == version - 1:
                records[-1][1] = now  # this peer's last hand-over went into this step
            self.versions.append((now, version))
            accumulator.zero_gradients()
            self.ready_at = now + self.learner_seconds
            return True
        if not accumulator.wants_gradients():
            return False
        batches = self.handed_in[1] if self.handed_in[0] == version else 0
        if time.monotonic() >= self.ready_at and batches < self.batches_per_step:
            for param, grad in zip(self.model.parameters(), self.fake, strict=True):
                param.grad.copy_(grad)
            accumulator.reduce_gradients(self.batch_size)
            self.handed_in = version, batches + 1
            if batches + 1 < self.batches_per_step:  # the next batch of the same step
                self.ready_at = time.monotonic() + self.learner_seconds
            else:  # the step's last hand-over: its reduction is timed
                records.append([time.monotonic(), None, version])
            return True
        if not alone:  # as examples/vtrace/learner.py: nobody waits for a lone peer
            accumulator.skip_gradients()
        return False


def run_peer(args):
    import moolib
    import torch

    torch.set_num_threads(1)
    model, fake = model_parameters(args.model)
    rpc = moolib.Rpc()
    rpc.set_name(args.name)
    rpc.connect(args.connect)
    group = moolib.Group(rpc, args.group)
    accumulator = moolib.Accumulator("model", model.parameters(), model.buffers(), group=group)
    accumulator.set_virtual_batch_size(args.virtual_batch_size or args.batch_size * args.peers)
    learner = StandInLearner(
        model, fake, args.batch_size, args.learner_seconds, args.batches_per_step
    )
    records, members_seen = [], []  # [handed in, reduced, model version]; (time, members)
    deadline = time.monotonic() + args.max_seconds
    last_print = 0.0
    while not os.path.exists(args.stop_file) and time.monotonic() < deadline:
        group.update()
        accumulator.update()
        if accumulator.wants_state():
            accumulator.set_state({"model": model.state_dict()})
        if accumulator.has_new_state():
            accumulator.state()  # a newcomer takes the group's model version with it
        members = len(group.members())
        now = time.monotonic()
        if not members_seen or members_seen[-1][1] != members:
            members_seen.append((now, members))
        if now - last_print >= 0.5:
            last_print = now
            print(f"members {members} version {accumulator.model_version()}", flush=True)
        busy = accumulator.connected() and learner.turn(
            accumulator, records, members == 1, group.sync_id()
        )
        if not busy:
            time.sleep(IDLE_SLEEP_S)
    with open(args.out + ".part", "w") as f:
        results = {"name": args.name, "steps": records, "members": members_seen}
        json.dump({**results, "versions": learner.versions}, f)
    os.replace(args.out + ".part", args.out)
    print(f"wrote {len(records)} steps", flush=True)
    os._exit(0)  # moolib's teardown can crash the interpreter's: the results are written


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m bench.standin_peer", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--broker", metavar="ADDRESS", help="run a broker at ADDRESS instead")
    p.add_argument("--connect", help="the broker's address")
    p.add_argument("--group", default="scaling")
    p.add_argument("--name", default=f"peer-{os.getpid()}")
    p.add_argument("--model", choices=sorted(MODELS), default="resnet")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--peers", type=int, default=1, help="virtual batch = batch size x peers")
    p.add_argument("--virtual-batch-size", type=int, help="default: batch size x peers")
    p.add_argument("--batches-per-step", type=int, default=1,
                   help="batches each peer hands over per optimizer step")  # fmt: skip
    p.add_argument("--learner-seconds", type=float, default=0.0)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--out")
    p.add_argument("--max-seconds", type=float, default=600)
    return p.parse_args(argv)


def main(argv=None):
    die_with_parent()
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--then-exec"]:  # run another program that dies with the benchmark too
        os.execv(argv[1], argv[1:])  # (the parent-death signal outlives exec)
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    if args.broker:
        run_broker(args.broker, args.stop_file)
    else:
        run_peer(args)


if __name__ == "__main__":
    main()
