"""Acting's own work per act: the time Actor.step takes around the model and the envs, on
stand-ins that cost nearly nothing (envs whose step returns the same shared buffers, a model
that returns zeros), with MinAtar's shapes and preset=minatar's batches.

    python -m bench.acting                    # 64 envs per actor batch, 7 channels (Freeway)
    python -m bench.acting --envs 32 --channels 4

Prints the best of five rounds, in microseconds per act; compare only runs made one after the
other on the same machine.
"""

import argparse
import time
from types import SimpleNamespace

import torch

from examples.vtrace.actor import Actor

LEARNER_BATCH = 8
UNROLL_LENGTH = 20
NUM_ACTIONS = 3


class StandInEnvs:
    """EnvPool's interface: each batch's step returns the same buffers, as its shared memory."""

    def __init__(self, num_envs, channels, num_batches=2):
        generator = torch.Generator().manual_seed(0)

        def buffers():
            return {
                "state": torch.rand(num_envs, 10, 10, channels, generator=generator) < 0.1,
                "reward": torch.zeros(num_envs),
                "done": torch.rand(num_envs, generator=generator) < 0.01,
                "truncated": torch.zeros(num_envs, dtype=torch.bool),
            }

        self.results = [buffers() for _ in range(num_batches)]

    def step(self, batch, actions):
        return SimpleNamespace(result=lambda: self.results[batch])


class StandInModel(torch.nn.Module):
    def initial_state(self, batch_size):
        return ()

    def forward(self, inputs, core_state=()):
        batch = inputs["state"].shape[1]
        logits = torch.zeros(1, batch, NUM_ACTIONS)
        return {"policy_logits": logits, "baseline": torch.zeros(1, batch)}, ()


def microseconds_per_act(actor, acts):
    start = time.perf_counter()
    for _ in range(acts):
        actor.step()
    return (time.perf_counter() - start) / acts * 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m bench.acting", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--envs", type=int, default=64, help="envs per actor batch")
    parser.add_argument("--channels", type=int, default=7, help="MinAtar's: 4 to 10")
    parser.add_argument("--acts", type=int, default=2000, help="acts per round")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    flags = SimpleNamespace(
        actor_batch_size=args.envs, num_actor_batches=2, batch_size=LEARNER_BATCH,
        unroll_length=UNROLL_LENGTH, use_lstm=False, unroll_groups=True,
    )  # fmt: skip
    actor = Actor(flags, StandInEnvs(args.envs, args.channels), StandInModel(), "cpu")
    microseconds_per_act(actor, args.acts // 4)  # warm-up
    best = min(microseconds_per_act(actor, args.acts) for _ in range(5))
    print(f"Actor.step: {best:.0f} us per act ({args.envs} envs, {args.channels} channels)")


if __name__ == "__main__":
    main()
