"""A peer whose model or settings do not fit its group is refused at join, in one line, and the
group trains on; settings that may differ per peer are let in (examples/vtrace/admission.py)."""

import math
import time

import pytest
from helpers import CARTPOLE, experiment, read_rows

# Long enough that peer A still trains while B is started, checked and refused.
TRAINING = [*CARTPOLE, "total_steps=10000000", "log_interval=1"]


def started_training(peer, log, timeout=120):
    """Wait until `peer` has written log rows as a member of its group."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert peer.poll() is None, peer.output
        if log.exists() and len(read_rows(log)) >= 2:
            return
        time.sleep(0.5)
    raise AssertionError(f"no training rows in {log}:\n{peer.output}")


def finite_rows(log):
    rows = read_rows(log)
    return rows, all(math.isfinite(float(r["grad_norm"])) for r in rows if r["grad_norm"] != "nan")


# Each override with phrases its one-line refusal must hold.
MISFITS = [
    ("env.name=Acrobot-v1", ["env.name=Acrobot-v1 here, CartPole-v1 in the group",
                             "policy.weight [3, 64] here, [2, 64] in the group"]),
    ("optimizer.learning_rate=10000", ["optimizer.learning_rate=10000.0 here, 0.002 in the group"]),
    ("use_lstm=true", ["use_lstm=True here, False in the group", "core.weight_ih_l0"]),
]  # fmt: skip


@pytest.mark.slow
def test_a_peer_that_does_not_fit_is_refused_at_join(children, broker, tmp_path):
    # One group for all misfits: A's start is most of this test's time.
    savedir = tmp_path / "group"
    a = children(experiment(broker, savedir, *TRAINING, "local_name=A"), "A")
    log_a = savedir / "peers" / "A" / "logs.tsv"
    started_training(a, log_a)
    for n, (override, expected) in enumerate(MISFITS):
        rows_before = len(read_rows(log_a))
        b = children(experiment(broker, savedir, *TRAINING, f"local_name=B{n}", override), f"B{n}")
        assert b.wait(timeout=120) != 0, b.output
        errors = [line for line in b.output.splitlines() if line.startswith("experiment: error:")]
        assert len(errors) == 1, (override, b.output)
        for phrase in expected:
            assert phrase in errors[0], errors[0]
        assert "Traceback" not in b.output
        # The group did not notice: A trains on alone and its numbers stay finite.
        time.sleep(4)
        assert a.poll() is None, a.output
        rows, finite = finite_rows(log_a)
        assert len(rows) > rows_before + 2 and finite, override
        assert all(r["peers"] == "1" for r in rows), [r["peers"] for r in rows]


@pytest.mark.slow
def test_per_peer_settings_may_differ(children, broker, tmp_path):
    savedir = tmp_path / "group"
    a = children(experiment(broker, savedir, *TRAINING, "local_name=A"), "A")
    started_training(a, savedir / "peers" / "A" / "logs.tsv")
    b_args = [*TRAINING, "local_name=B", "actor_batch_size=8", "batch_size=8", "seed=3",
              "max_queued_batches=3", "log_interval=0.5"]  # fmt: skip
    b = children(experiment(broker, savedir, *b_args), "B")
    log_b = savedir / "peers" / "B" / "logs.tsv"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert b.poll() is None, b.output
        if log_b.exists() and any(r["peers"] == "2" for r in read_rows(log_b)):
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"B never trained with A:\n{b.output}")
    assert "error" not in b.output
