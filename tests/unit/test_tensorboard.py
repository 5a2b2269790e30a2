"""examples/common/tensorboard.py: the TSV log's rows as TensorBoard scalars."""

import math

import numpy as np
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from examples.common.tensorboard import TensorBoardLog


def scalars(logdir):
    events = EventAccumulator(str(logdir))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def test_numbers_become_scalars_at_the_row_step(tmp_path):
    with TensorBoardLog(tmp_path) as log:
        log.write({"step": 100, "mean_episode_return": 21.5, "SPS": np.float32(950.0),
                   "is_leader": True, "grad_norm": torch.tensor(3.0)})  # fmt: skip
        log.write({"step": 200, "mean_episode_return": math.nan, "SPS": 1000, "is_leader": False,
                   "grad_norm": 2.0})  # fmt: skip
    found = scalars(tmp_path)
    assert found["mean_episode_return"] == [(100, 21.5)]  # the NaN row is left out
    assert found["SPS"] == [(100, 950.0), (200, 1000.0)]
    assert found["is_leader"] == [(100, 1.0), (200, 0.0)]
    assert found["grad_norm"] == [(100, 3.0), (200, 2.0)]
    assert "step" not in found


def test_text_is_skipped_and_rows_without_step_are_numbered(tmp_path):
    log = TensorBoardLog(tmp_path)
    log.write({"loss": 1.0, "leader": "host-1"})
    log.write({"loss": 0.5, "leader": "host-2"})
    log.close()
    log.close()  # twice is harmless
    found = scalars(tmp_path)
    assert found == {"loss": [(0, 1.0), (1, 0.5)]}
