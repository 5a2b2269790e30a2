"""examples/a2c.py: the loss by hand, the command line, and short real training runs."""

import csv
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import REPO, read_rows

from examples.a2c import Policy, a2c_loss, parse_args

A2C = REPO / "examples" / "a2c.py"




def test_loss_matches_a_hand_computation():
    # One env, T = 2 (three steps); the episode ends on the second action (done at step 2).
    logits = torch.tensor([[[0.0, 0.0]], [[math.log(3.0), 0.0]], [[0.0, 0.0]]], requires_grad=True)
    values = torch.tensor([[1.0], [2.0], [5.0]], requires_grad=True)
    actions = torch.tensor([[0], [1], [0]])
    rewards = torch.tensor([[0.0], [1.0], [2.0]])
    done = torch.tensor([[False], [False], [True]])
    gamma = 0.9
    total, stats = a2c_loss(logits, values, actions, rewards, done, gamma, 0.5, 0.01)

    # Returns: step 1 ends the episode, so no bootstrap from values[2] = 5.
    #   R1 = r2 = 2;  R0 = r1 + 0.9 * R1 = 2.8.  Advantages: 2.8 - 1 = 1.8, 2 - 2 = 0.
    # log pi: step 0 uniform -> log 0.5; step 1 pi = (0.75, 0.25), action 1 -> log 0.25.
    pg = -(math.log(0.5) * 1.8 + math.log(0.25) * 0.0) / 2
    baseline = 0.5 * (1.8**2 + 0.0**2) / 2
    neg_entropy = (2 * 0.5 * math.log(0.5) + 0.75 * math.log(0.75) + 0.25 * math.log(0.25)) / 2
    assert stats["pg_loss"] == pytest.approx(pg, rel=1e-6)
    assert stats["baseline_loss"] == pytest.approx(baseline, rel=1e-6)
    assert stats["entropy_loss"] == pytest.approx(neg_entropy, rel=1e-6)
    assert total.item() == pytest.approx(pg + 0.5 * baseline + 0.01 * neg_entropy, rel=1e-6)

    total.backward()
    # The baseline gradient reaches the values, but the bootstrap value (step 2) gets none.
    assert values.grad[0].item() == pytest.approx(-0.5 * 1.8 / 2, rel=1e-6)
    assert values.grad[2].item() == 0.0
    # The last step's logits only bootstrap; they get no policy gradient.
    assert torch.all(logits.grad[2] == 0)


def test_bootstrap_when_no_episode_ends():
    T, B = 3, 2
    values = torch.full((T + 1, B), 10.0)
    rewards = torch.ones(T + 1, B)
    done = torch.zeros(T + 1, B, dtype=torch.bool)
    logits = torch.zeros(T + 1, B, 2)
    actions = torch.zeros(T + 1, B, dtype=torch.int64)
    _, stats = a2c_loss(logits, values, actions, rewards, done, 0.5, 1.0, 0.0)
    # R2 = 1 + 0.5 * 10 = 6; R1 = 1 + 0.5 * 6 = 4; R0 = 1 + 0.5 * 4 = 3; advantages -7, -6, -4.
    assert stats["baseline_loss"] == pytest.approx(0.5 * (49 + 36 + 16) / 3)


def test_lstm_state_resets_on_done():
    torch.manual_seed(0)
    model = Policy(4, 2, 16, use_lstm=True)
    obs = torch.randn(4, 1, 4)
    done = torch.tensor([[False], [False], [True], [False]])
    logits, _, _ = model(obs, done, model.initial_state(1))
    fresh, _, _ = model(obs[2:], torch.zeros(2, 1, dtype=torch.bool), model.initial_state(1))
    torch.testing.assert_close(logits[2:], fresh)


def test_default_address_is_loopback():
    # moolib has no authentication: the broker inside a2c.py must not listen on the network.
    args = parse_args([])
    assert args.address.startswith("127.0.0.1:")
    assert int(args.address.rsplit(":", 1)[1]) > 0


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--total-steps", "-5"], "--total-steps"),
        (["--batch-size", "0"], "--batch-size"),
        (["--unroll-length", "abc"], "--unroll-length"),
        (["--connect", "localhost"], "HOST:PORT"),
        (["--connect", "127.0.0.1:99999"], "port"),
        (["--connect", "no-such-host.invalid:4431"], "cannot resolve"),
        (["--env", "NoSuchEnv-v9"], "unknown environment"),
        (["--lr", "-1"], "--lr"),
        (["--num-batches", "0"], "--num-batches"),
    ],
)
def test_bad_flags_give_one_clear_line(flags, message, tmp_path):
    result = subprocess.run(
        [sys.executable, A2C, *flags], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert message in result.stderr
    assert not (tmp_path / "logs.tsv").exists()


@pytest.mark.slow
def test_one_batch_mlp_learns_cartpole(tmp_path):
    # The benchmark's layout: all 8 envs in one batch, no LSTM (and its own default rate).
    args = [sys.executable, A2C, "--batch-size", "8", "--num-batches", "1", "--no-lstm"]
    args += ["--total-steps", "40000", "--seed", "0"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_rows(tmp_path / "logs.tsv")
    assert {r["virtual_batch_size"] for r in rows} == {"40"}  # 8 envs x 5 steps per update
    finite = [float(r["mean_episode_return"]) for r in rows]
    finite = [r for r in finite if not math.isnan(r)]
    # Random play scores about 22.
    assert sum(finite[-50:]) / 50 > 60, finite[-50:]


@pytest.mark.slow
def test_a2c_learns_cartpole_and_appends_to_its_log(tmp_path):
    args = [sys.executable, A2C, "--total-steps", "40000", "--seed", "1", "--num-processes", "1"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "terminate called" not in result.stderr
    assert "SPS" in result.stdout  # progress lines

    rows = read_rows(tmp_path / "logs.tsv")
    expected = "step mean_episode_return pg_loss baseline_loss entropy_loss grad_norm SPS time"
    for column in expected.split() + ["model_version", "virtual_batch_size", "peers"]:
        assert column in rows[0], column
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(steps) and 39000 <= steps[-1] <= 40000 + 8
    returns = [float(r["mean_episode_return"]) for r in rows]
    finite = [r for r in returns if not math.isnan(r)]
    early = sum(finite[:50]) / 50
    late = sum(finite[-50:]) / 50
    # Random play scores about 22; the tolerant bar leaves room for a slow seed on a busy machine.
    assert late > 60, (early, late)
    assert late > 2 * early, (early, late)

    # A second run appends below the first one's rows, under the same header.
    rerun = args[:3] + ["2000"] + args[4:]
    result = subprocess.run(rerun, capture_output=True, text=True, timeout=200, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    again = read_rows(tmp_path / "logs.tsv")
    assert again[: len(rows)] == rows and len(again) > len(rows)
    assert (tmp_path / "logs.tsv").read_text().count("\tmean_episode_return\t") == 1


@pytest.mark.slow
def test_a_second_a2c_joins_the_first_and_gets_its_model(children, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = children(
        [sys.executable, A2C, "--total-steps", "400000", "--num-processes", "1"],
        "first",
        cwd=tmp_path / "a",
    )
    line = first.wait_for_line(lambda s: s.startswith("Broker listening at"), timeout=120)
    assert line, first.output
    address = line.split()[3].rstrip(";")
    assert first.wait_for_line(lambda s: s.startswith("step "), timeout=120), first.output
    second = children(
        [
            sys.executable,
            A2C,
            "--connect",
            address,
            "--total-steps",
            "8000",
            "--num-processes",
            "1",
        ],
        "second",
        cwd=tmp_path / "b",
    )
    assert second.wait(timeout=240) == 0, second.output
    rows = read_rows(tmp_path / "b" / "logs.tsv")
    # The newcomer continued the first run's model (its versions start far from 0), and the
    # two shared gradients: some steps had more than one rollout in them.
    assert int(rows[0]["model_version"]) > 20, rows[0]
    assert any(int(r["virtual_batch_size"]) > 40 for r in rows), [
        r["virtual_batch_size"] for r in rows
    ]
    assert any(r["peers"] == "2" for r in rows)


def process_group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_cleanly_and_env_workers_exit(children, tmp_path, sig):
    a2c = children([sys.executable, A2C, "--log-interval", "1"], "a2c", cwd=tmp_path)
    assert a2c.wait_for_line(lambda s: s.startswith("step "), timeout=120), a2c.output
    a2c.signal(sig)
    assert a2c.wait(timeout=60) == 0, a2c.output
    assert a2c.lines[-1].startswith("stopped by"), a2c.output
    for bad in ("Traceback", "terminate called", "Aborted", "leaked"):
        assert bad not in a2c.output
    # The EnvPool worker processes (same process group) go away by themselves.
    deadline = time.monotonic() + 30
    while process_group_alive(a2c.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not process_group_alive(a2c.proc.pid), "EnvPool workers outlived a2c.py"
