"""The rows of a TSV log as TensorBoard scalars, one event file per writer.

    log = TensorBoardLog("savedir/peers/peer0")
    log.write({"step": 1600, "mean_episode_return": 21.5, "SPS": 950.0})
    log.close()

Every number of a row becomes a scalar of the same name, at the row's `step` (or at the row's
position when it has none). NaN, the TSV log's mark for "nothing this interval" (no episode
ended, no gradient yet), is left out rather than drawn as a gap or a spike. Text and other
values are skipped: TensorBoard scalars are numbers.
"""

import math
import numbers
import pathlib


def _number(value):
    if hasattr(value, "item") and not isinstance(value, str):  # numpy scalars, 1-element tensors
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return int(value) if isinstance(value, bool) else None
    value = float(value)
    return None if math.isnan(value) else value


class TensorBoardLog:
    def __init__(self, logdir, step_key="step"):
        self.logdir = pathlib.Path(logdir)
        self.step_key = step_key
        self._rows = 0
        # torch.utils.tensorboard imports the tensorboard package: only when asked for.
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(self.logdir))

    def write(self, row: dict):
        step = _number(row.get(self.step_key))
        step = self._rows if step is None else int(step)
        self._rows += 1
        for key, value in row.items():
            if key == self.step_key:
                continue
            number = _number(value)
            if number is not None:
                self._writer.add_scalar(key, number, global_step=step)
        # A row every few seconds: flushing each one costs little and keeps TensorBoard current.
        self._writer.flush()

    def close(self):
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
