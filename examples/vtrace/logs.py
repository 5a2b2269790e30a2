"""What a V-trace peer reports: one row per log interval to localdir/logs.tsv (and wandb when
asked), and a progress line on stdout."""

import os
import pathlib

from examples.common.stats import Stats
from examples.common.tensorboard import TensorBoardLog
from examples.common.tsvlog import TsvLog
from examples.vtrace.config import as_dict


def start_wandb(flags):
    """Start a wandb run that can neither hang nor prompt: offline unless an API key is set."""
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    has_key = bool(os.environ.get("WANDB_API_KEY")) or (pathlib.Path.home() / ".netrc").exists()
    mode = os.environ.get("WANDB_MODE") or ("online" if has_key else "offline")
    kwargs = dict(
        project=flags.project, entity=flags.entity, group=flags.group, name=flags.local_name,
        config=as_dict(flags), dir=flags.localdir,
    )  # fmt: skip
    try:
        run = wandb.init(mode=mode, settings=wandb.Settings(init_timeout=30), **kwargs)
    except Exception as e:  # wandb raises many kinds; any of them means: go offline
        print(f"wandb: could not start online ({e}); logging offline instead")
        mode = "offline"
        run = wandb.init(mode=mode, **kwargs)
    if mode == "offline":
        run_dir = pathlib.Path(run.dir).parent  # run.dir is the run's files/ folder
        print(f"wandb: offline run in {run_dir}; upload it later with `wandb sync {run_dir}`")
    return run


WAITING_NOTE_S = 10  # seconds between "Waiting for the broker" lines

# The columns of logs.tsv, in order. A resumed run appends to the same file only while they
# stay the same (see TsvLog), so new ones go at the end.
COLUMNS = [
    "step", "env_train_steps", "model_version", "mean_episode_return",
    "global_mean_episode_return", "episodes", "SPS", "local_env_steps", "global_env_steps",
    "virtual_batch_size", "peers", "is_leader", "lr", "grad_norm", "pg_loss", "baseline_loss",
    "entropy_loss", "dropped_unrolls", "dropped_batches", "time", "skipped_steps",
    "nonfinite_batches", "clip_fraction", "policy_lag",
]  # fmt: skip


class ProgressLog:
    """Gathers this peer's numbers between rows and writes a row every `log_interval` s."""

    def __init__(self, flags, start):
        self.interval = flags.log_interval
        self.tsv = TsvLog(pathlib.Path(flags.localdir) / "logs.tsv")
        self.wandb = start_wandb(flags) if flags.wandb else None
        self.tensorboard = TensorBoardLog(flags.localdir) if flags.tensorboard else None
        self.local = Stats()  # since the last row
        self.last_row = start
        self.last_note = (
            start - WAITING_NOTE_S + 3
        )  # the first after 3 s: connecting takes a moment

    def note_waiting(self, now, address):
        if now - self.last_note >= WAITING_NOTE_S:
            print(f"Waiting for the broker at {address} ...", flush=True)
            self.last_note = now

    def add(self, stats):
        self.local += stats

    def count(self, key, n=1):
        """n more of a countable event (a dropped unroll, a dropped batch)."""
        self.local.add(key, n)

    def due(self, now):
        return now - self.last_row >= self.interval

    def write(self, now, row, leader):
        """Write `row` with this peer's numbers since the last row added to it."""
        local = self.local
        values = {
            **row,
            "mean_episode_return": local.mean("episode_return"),
            "episodes": local.counts["episode_return"],
            "SPS": local.sum("env_steps") / max(now - self.last_row, 1e-6),
            "local_env_steps": local.sum("env_steps"),
            "dropped_unrolls": local.sum("dropped_unrolls"),
            "dropped_batches": local.sum("dropped_batches"),
            "nonfinite_batches": local.sum("nonfinite_batches"),
        }
        row = {key: values[key] for key in COLUMNS}
        self.tsv.write(row)
        if self.wandb is not None:
            self.wandb.log(row)
        if self.tensorboard is not None:
            self.tensorboard.write(row)
        print(
            f"steps {row['env_train_steps']:>10d} | SPS {row['SPS']:7.0f} | "
            f"return {row['mean_episode_return']:7.2f} | version {row['model_version']} | "
            f"peers {row['peers']} | leader {leader}",
            flush=True,
        )
        self.local = Stats()
        self.last_row = now

    def close(self):
        self.tsv.close()
        if self.wandb is not None:
            self.wandb.finish()
        if self.tensorboard is not None:
            self.tensorboard.close()
