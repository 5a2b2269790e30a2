"""A minimal moolib peer for the engine sanity test (run as a subprocess by test_moolib.py).

It fits a small linear model on fixed data through Group + Accumulator, joining the group
``--rounds`` times in a row (a fresh Rpc, Group and Accumulator each time, with new random
initial weights), and saves the weights it had after every model version. A correct state
hand-over makes every peer hold identical weights at every model version after it joined.
"""

import argparse
import signal
import time

import moolib
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--broker", required=True)
parser.add_argument("--group", required=True)
parser.add_argument("--name", required=True)
parser.add_argument("--seed", type=int, required=True)
parser.add_argument("--rounds", type=int, default=1)
parser.add_argument(
    "--steps-per-round", type=int, default=0, help="updates per round; 0 = until SIGTERM"
)
parser.add_argument("--out", required=True)
parser.add_argument("--timeout", type=float, default=120)
args = parser.parse_args()

# The same data for every peer; each gradient uses the batch chosen by the model version, so that
# every peer contributes the same kind of gradient whatever its timing.
data_gen = torch.Generator().manual_seed(1234)
X = torch.randn(256, 8, generator=data_gen)
Y = X @ torch.randn(8, 1, generator=data_gen) + 0.1 * torch.randn(256, 1, generator=data_gen)

stop_requested = False


def request_stop(signum, frame):
    global stop_requested
    stop_requested = True


signal.signal(signal.SIGTERM, request_stop)

weights_by_version = {}
joined_at = []
deadline = time.monotonic() + args.timeout

for round_index in range(args.rounds):
    torch.manual_seed(args.seed * 1000 + round_index)
    model = torch.nn.Linear(8, 1)
    # Momentum makes the optimizer state matter: a peer with the wrong one drifts.
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.zero_grad(set_to_none=False)

    rpc = moolib.Rpc()
    rpc.set_name(f"{args.name}-{round_index}")
    rpc.set_timeout(10)
    group = moolib.Group(rpc, args.group)
    group.set_timeout(5)
    accumulator = moolib.Accumulator("linear", model.parameters(), model.buffers(), group=group)
    accumulator.set_virtual_batch_size(32)
    rpc.connect(args.broker)

    first_version = None
    while time.monotonic() < deadline:
        group.update()
        accumulator.update()
        if not accumulator.connected():
            time.sleep(0.01)
            continue
        if accumulator.wants_state():
            accumulator.set_state({"model": model.state_dict(), "optimizer": opt.state_dict()})
        if accumulator.has_new_state():
            state = accumulator.state()
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
        if first_version is None:
            first_version = accumulator.model_version()
            joined_at.append(first_version)
            print(f"joined at version {first_version}", flush=True)
        version = accumulator.model_version()
        if stop_requested or (
            args.steps_per_round and version >= first_version + args.steps_per_round
        ):
            break
        if accumulator.wants_gradients():
            rows = torch.arange(32) + (version * 32) % 224
            loss = torch.nn.functional.mse_loss(model(X[rows]), Y[rows])
            model.zero_grad(set_to_none=False)
            loss.backward()
            accumulator.reduce_gradients(32)
        if accumulator.has_gradients():
            opt.step()
            accumulator.zero_gradients()
            weights_by_version[accumulator.model_version()] = torch.cat(
                [p.detach().flatten().clone() for p in model.parameters()]
            )
            print(f"version {accumulator.model_version()}", flush=True)
        time.sleep(0.002)
    else:
        raise SystemExit(f"{args.name}: timed out in round {round_index}")
    # Dropping the objects leaves the group; the next round joins as a newcomer.
    del accumulator, group, rpc
    if stop_requested:
        break

torch.save({"weights": weights_by_version, "joined_at": joined_at}, args.out)
print("done", flush=True)
