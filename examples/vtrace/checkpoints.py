"""The group's checkpoints: resuming from savedir/checkpoint.tar, and the leader's periodic and
final writes of it (never over a newer one)."""

import pathlib

from examples.common import checkpoint
from examples.vtrace.config import as_dict


def load_checkpoint(flags, state):
    """Resume from savedir/checkpoint.tar if there is one; returns its model version or None."""
    path = pathlib.Path(flags.savedir) / "checkpoint.tar"
    if not path.exists():
        return None
    data = checkpoint.load(path)
    saved_env = data.get("flags", {}).get("env", {}).get("name")
    if saved_env and saved_env != flags.env.name:
        raise checkpoint.CheckpointError(
            f"{path} was trained on {saved_env}, not {flags.env.name}; "
            "use another savedir or the same env.name"
        )
    try:
        state.load_state_dict(data)
    except (RuntimeError, KeyError, ValueError) as e:
        reason = str(e).strip().splitlines()[0]
        saved = data.get("flags", {})
        if "full_action_space" not in saved.get("env", {}) and flags.env.name.startswith("ALE/"):
            reason += "; it is from before env.full_action_space: try env.full_action_space=true"
        elif saved.get("atari_net", "resnet") != flags.atari_net:
            reason += f"; it was trained with atari_net={saved.get('atari_net', 'resnet')}"
        raise checkpoint.CheckpointError(
            f"{path} does not fit this model ({reason}); use another savedir or the same settings"
        ) from None
    return data["model_version"]


def save_checkpoint(flags, state, model_version, history=False):
    data = state.state_dict()
    data["model_version"] = model_version
    data["flags"] = as_dict(flags)
    savedir = pathlib.Path(flags.savedir)
    # Never over a newer checkpoint (raises checkpoint.NotNewer): a peer that fell behind or
    # never joined must not put the group's training back.
    checkpoint.save_if_newer(data, savedir / "checkpoint.tar")
    if history:
        checkpoint.save_atomic(data, savedir / f"checkpoint_v{model_version}.tar")


class Checkpointer:
    """The leader writes savedir/checkpoint.tar every checkpoint_interval seconds, and keeps a
    copy as checkpoint_v<model version>.tar every checkpoint_history_interval seconds."""

    def __init__(self, flags, start):
        self.flags = flags
        self.last_write = self.last_history = start
        # Leader of a connected group at the last update: a stopping leader whose broker went
        # away at the same moment still writes its final checkpoint.
        self.was_leader = False

    def update(self, now, state, accumulator):
        self.was_leader = accumulator.is_leader() and accumulator.connected()
        if not self.was_leader or now - self.last_write < self.flags.checkpoint_interval:
            return
        history = now - self.last_history >= self.flags.checkpoint_history_interval
        self.last_write = now
        try:
            save_checkpoint(self.flags, state, accumulator.model_version(), history=history)
        except checkpoint.NotNewer as e:
            print(f"Checkpoint not written: {e}")
            return
        if history:
            self.last_history = now

    def final(self, state, accumulator):
        """The checkpoint written when the peer stops, by the connected leader only; otherwise
        one line says why not."""
        if not (self.was_leader or (accumulator.is_leader() and accumulator.connected())):
            if not accumulator.connected():
                why = f"this peer never joined its group (no broker at {self.flags.connect})"
            else:
                why = f"this peer is not the group's leader ({accumulator.get_leader()} is)"
            print(f"Checkpoint not written: {why}")
            return
        try:
            save_checkpoint(self.flags, state, accumulator.model_version())
        except checkpoint.NotNewer as e:
            print(f"Checkpoint not written: {e}")
            return
        print(f"Checkpoint written to {self.flags.savedir}/checkpoint.tar")
