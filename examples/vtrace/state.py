"""What a group shares and a checkpoint holds: the weights, the optimizer, the step counters and
the all-reduced stats."""

import torch

from examples.common.stats import Stats


class LearnerState:
    """What a peer hands to newcomers and writes to checkpoints: weights, optimizer, counters."""

    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer
        # Exact and identical on every peer: grown by the reduced batch size at every update.
        self.env_train_steps = 0
        # Samples learned from, each pass over a batch counted (see learner_passes).
        self.learned_samples = 0
        self.global_stats = Stats()  # all-reduced env steps and episode returns
        # Optimizer steps left out because the group's reduced gradients were not finite: the
        # same on every peer, since every peer sees the same reduced gradients.
        self.skipped_steps = 0

    def state_dict(self):
        # On the CPU, so that a peer without a GPU can load what a GPU peer sends.
        optimizer = self.optimizer.state_dict()
        optimizer["state"] = {
            index: {key: value.cpu() if torch.is_tensor(value) else value
                    for key, value in param_state.items()}
            for index, param_state in optimizer["state"].items()
        }  # fmt: skip
        return {
            "model": {key: value.cpu() for key, value in self.model.state_dict().items()},
            "optimizer": optimizer,
            "env_train_steps": self.env_train_steps,
            "learned_samples": self.learned_samples,
            "global_stats": self.global_stats.to_dict(),
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, state):
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.env_train_steps = state["env_train_steps"]
        self.learned_samples = state.get("learned_samples")  # None: from before learner_passes
        self.global_stats = Stats.from_dict(state["global_stats"])
        self.skipped_steps = state.get("skipped_steps", 0)
