"""MinAtar's torso, the compiled op (examples/vtrace/minatar_torso.py) against the dense torch
ops, on one thread: a learner minibatch's forward and backward passes (8 unrolls of 21 frames)
and an act's forward pass (64 frames), on frames of the game played at random, through a net's
weights (a checkpoint's, or a fresh net's).

    python -m bench.minatar_torso --game Asterix --checkpoint runs/Asterix-s0/checkpoint.tar
    python -m bench.minatar_torso --game SpaceInvaders            # a fresh net

Each variant is timed in alternating rounds (the best of each printed last): on a shared or
virtual machine only timings taken side by side compare.
"""

import argparse
import os
import time

import numpy as np
import torch

from examples.common.envs import EnvFactory
from examples.vtrace import minatar_torso
from examples.vtrace.models import MinAtarNet

LEARNER_FRAMES, ACTING_FRAMES = 168, 64
GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")


def frames_of(game: str, count: int, seed: int = 0) -> torch.Tensor:
    factory = EnvFactory(f"MinAtar/{game}-v1", seed=seed)
    env, (_, action_space) = factory(), factory.spaces()
    rng = np.random.default_rng(seed)
    env.reset()
    frames = []
    for _ in range(count):
        obs, _, done, _ = env.step(int(rng.integers(action_space.n)))
        frames.append(torch.as_tensor(obs))
        if done:
            env.reset()
    return torch.stack(frames)


def net_for(frames: torch.Tensor, checkpoint: str | None) -> MinAtarNet:
    torch.manual_seed(0)
    state = (
        torch.load(checkpoint, map_location="cpu", weights_only=True)["model"]
        if checkpoint
        else None
    )
    hidden = state["fc.weight"].shape[0] if state else 256
    actions = state["policy.weight"].shape[0] if state else 6
    net = MinAtarNet(tuple(frames.shape[1:]), actions, hidden_size=hidden)
    if state:
        net.load_state_dict(state)
    return net


def milliseconds(call, repeats: int) -> float:
    for _ in range(repeats // 10):
        call()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats * 1e3


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", default="Asterix", choices=GAMES)
    parser.add_argument(
        "--checkpoint", help="a V-trace checkpoint of this game (default: a fresh net)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.checkpoint and not os.path.isfile(args.checkpoint):
        parser.error(f"no such checkpoint: {args.checkpoint}")
    if minatar_torso.compiled_op() is None:
        raise SystemExit("error: the op is not built (make install builds it)")
    torch.set_num_threads(1)
    frames = frames_of(args.game, LEARNER_FRAMES)
    net = net_for(frames, args.checkpoint)
    params = [net.conv.weight, net.conv.bias, net.fc.weight, net.fc.bias]
    upstream = torch.randn(LEARNER_FRAMES, net.fc.weight.shape[0])
    with torch.no_grad():
        conv = net.conv(frames.permute(0, 3, 1, 2).float())
    fired = (conv > 0).flatten(1).sum(1).float().mean().item()
    print(
        f"{args.game}: {(frames != 0).sum().item() / len(frames):.1f} non-zero cells and "
        f"{fired:.0f} of {conv[0].numel()} conv features a frame"
    )

    def learner(torso):
        return lambda: torch.autograd.grad(torso(frames, net.conv, net.fc), params, upstream)

    def acting(torso):
        def call():
            with torch.no_grad():
                torso(frames[:ACTING_FRAMES], net.conv, net.fc)

        return call

    torsos = {"dense": minatar_torso.dense_torso, "op": minatar_torso.minatar_torso}
    best = {}
    for round_ in range(args.rounds):
        for part, make, repeats in (("learner", learner, 200), ("acting", acting, 1000)):
            times = {name: milliseconds(make(torso), repeats) for name, torso in torsos.items()}
            for name, ms in times.items():
                best[part, name] = min(best.get((part, name), ms), ms)
            shown = "  ".join(f"{name} {ms:.3f}" for name, ms in times.items())
            print(f"round {round_ + 1}  {part:7s} ms: {shown}")
    for part in ("learner", "acting"):
        print(f"best    {part:7s} ms: dense {best[part, 'dense']:.3f}  op {best[part, 'op']:.3f}")


if __name__ == "__main__":
    main()
