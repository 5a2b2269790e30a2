"""The learner side of a V-trace peer: the loss, the optimizer and its schedule, the state a
group shares (and checkpoints), and the thread that computes gradients while acting goes on.

The experiment, the evaluator and the benchmark all take these from here, so that what is
measured and evaluated is what trains.
"""

import concurrent.futures
import copy
import math
import pathlib

import torch
from omegaconf import OmegaConf
from torch import nn

from examples.common import checkpoint, vtrace
from examples.common.stats import Stats

LOSS_NAMES = ["pg_loss", "baseline_loss", "entropy_loss"]


def compute_loss(flags, model, batch):
    """V-trace actor-critic loss on a learner batch of T+1 steps ([T+1, B, ...]).

    Step t holds observation t, whether it starts a new episode (done), the reward that led to
    it, the action taken from it and the acting policy's logits there.
    """
    core_state = batch.get("core_state", ())
    outputs, _ = model({"state": batch["state"], "done": batch["done"]}, core_state)
    logits = outputs["policy_logits"][:-1]
    values = outputs["baseline"][:-1]
    rewards = batch["reward"][1:]
    if flags.reward_clip:
        rewards = rewards.clamp(-flags.reward_clip, flags.reward_clip)
    discounts = (~batch["done"][1:]).float() * flags.discounting
    actions = batch["action"][:-1]
    # The step that leaves the last observation of a time-limit cut is a filler
    # (envs.truncation_step): it bootstraps nothing and teaches nothing.
    mask = ~batch["truncated"][:-1] if "truncated" in batch else None
    returns = vtrace.from_logits(
        behavior_policy_logits=batch["policy_logits"][:-1],
        target_policy_logits=logits,
        actions=actions,
        discounts=discounts,
        rewards=rewards,
        values=values.detach(),
        bootstrap_value=outputs["baseline"][-1].detach(),
        mask=mask,
    )
    num_samples = actions.numel()
    pg_loss = vtrace.policy_gradient_loss(logits, actions, returns.pg_advantages) / num_samples
    baseline_loss = vtrace.baseline_loss(returns.vs - values) / num_samples
    entropy_loss = vtrace.entropy_loss(logits, mask) / num_samples
    total = pg_loss + flags.baseline_cost * baseline_loss + flags.entropy_cost * entropy_loss
    stats = {"pg_loss": pg_loss.item(), "baseline_loss": baseline_loss.item(),
             "entropy_loss": entropy_loss.item()}  # fmt: skip
    return total, stats


def gradients(flags, model, batch):
    """The gradients (one per parameter, in order) and the losses of one learner batch."""
    loss, losses = compute_loss(flags, model, batch)
    return torch.autograd.grad(loss, list(model.parameters())), losses


def create_optimizer(flags, model):
    return torch.optim.Adam(
        model.parameters(),
        lr=flags.optimizer.learning_rate,
        betas=(flags.optimizer.beta_1, flags.optimizer.beta_2),
        eps=flags.optimizer.epsilon,
    )


def learning_rate(flags, env_train_steps):
    """Linear warm-up over `warmup` steps, then linear decay to 0 at total_steps."""
    scale = max(0.0, 1.0 - env_train_steps / flags.total_steps)
    if flags.warmup > 0:
        scale *= min(1.0, env_train_steps / flags.warmup)
    return flags.optimizer.learning_rate * scale


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
        }

    def load_state_dict(self, state):
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.env_train_steps = state["env_train_steps"]
        self.learned_samples = state.get("learned_samples")  # None: from before learner_passes
        self.global_stats = Stats.from_dict(state["global_stats"])


def step_optimizer(flags, state, accumulator):
    """One optimizer step on the group's reduced gradients; returns numbers for the log."""
    virtual_batch = accumulator.get_gradient_stats()["batch_size"]  # unrolls, over all peers
    if state.learned_samples is None:
        state.learned_samples = state.env_train_steps * flags.learner_passes
    state.learned_samples += virtual_batch * flags.unroll_length
    # Every batch is learned from learner_passes times: env steps are the new samples only.
    state.env_train_steps = state.learned_samples // flags.learner_passes
    for param_group in state.optimizer.param_groups:
        param_group["lr"] = learning_rate(flags, state.env_train_steps)
    grad_norm = nn.utils.clip_grad_norm_(state.model.parameters(), flags.grad_norm_clipping)
    state.optimizer.step()
    accumulator.zero_gradients()
    return {"grad_norm": float(grad_norm), "virtual_batch_size": virtual_batch}


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
    data["flags"] = OmegaConf.to_container(flags, resolve=True)
    savedir = pathlib.Path(flags.savedir)
    # Never over a newer checkpoint (raises checkpoint.NotNewer): a peer that fell behind or
    # never joined must not put the group's training back.
    checkpoint.save_if_newer(data, savedir / "checkpoint.tar")
    if history:
        checkpoint.save_atomic(data, savedir / f"checkpoint_v{model_version}.tar")


class AsyncLearner:
    """Computes the gradients of one learner batch at a time in a second thread, so that acting
    goes on meanwhile (torch lets go of the GIL inside its kernels).

    The thread works on its own copy of the model, refreshed before every batch: the Accumulator
    and the optimizer change the live weights in place whenever they need to. A batch started
    before the group changed (another sync id) may have been computed on other weights than the
    group's, so its gradients are dropped rather than reduced.
    """

    def __init__(self, flags, model):
        self.flags = flags
        self.model = model
        self.model_copy = copy.deepcopy(model)
        self.thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="learner")
        self.running = None  # (future of gradients(), the group's sync id when it started)
        self.finished = None  # (gradients, sync id) not yet handed to the Accumulator
        self.losses = dict.fromkeys(LOSS_NAMES, math.nan)
        self.last_batch, self.passes_left = None, 0
        # (model version, sync id, batches) this peer reduced since the group's last step, until
        # the group steps past that version (or changes): see update(). A lone peer must be able
        # to fill a virtual batch by itself, so up to that many batches may go per step.
        self.in_flight = None
        self.batches_per_step = -(-flags.virtual_batch_size // flags.batch_size)

    def idle(self):
        return self.running is None and self.finished is None

    def start(self, batch, sync_id):
        self.model_copy.load_state_dict(self.model.state_dict())
        future = self.thread.submit(gradients, self.flags, self.model_copy, batch)
        self.running = future, sync_id

    def update(self, accumulator, sync_id, queue, alone=False):
        """Hand finished gradients over when the Accumulator wants them, and start on the next
        learner batch when it is free. `alone`: this peer is the group's only member. Returns how
        many batches were dropped (0 or 1) because the group changed since they started."""
        if self.running is not None and self.running[0].done():
            future, started_in = self.running
            self.running = None
            grads, self.losses = future.result()
            self.finished = grads, started_in
        dropped = 0
        if self.in_flight is not None and (
            accumulator.model_version() > self.in_flight[0] or sync_id != self.in_flight[1]
        ):
            self.in_flight = None
        # One virtual batch of this peer per optimizer step at most: when the group's reductions are
        # slower than this peer's backward passes (two peers on a busy machine), handing on
        # every batch would merge many of them into one step (virtual batches of 50-200 were
        # logged), and the group would take 4x fewer optimizer steps per env step than one peer.
        may_reduce = self.in_flight is None or self.in_flight[2] < self.batches_per_step
        if self.finished is not None and may_reduce and accumulator.wants_gradients():
            grads, started_in = self.finished
            self.finished = None
            if started_in == sync_id:
                for param, grad in zip(self.model.parameters(), grads, strict=True):
                    param.grad.copy_(grad)
                accumulator.reduce_gradients(self.flags.batch_size)
                batches = 1 if self.in_flight is None else self.in_flight[2] + 1
                self.in_flight = accumulator.model_version(), sync_id, batches
            else:
                dropped = 1
        if self.idle() and accumulator.wants_gradients():
            batch = self.next_batch(queue)
            if batch is not None:
                self.start(batch, sync_id)
        if (
            (self.finished is None or not may_reduce)
            and accumulator.wants_gradients()
            and not alone
        ):
            # moolib's contract: reduce or skip whenever it wants gradients. Nothing ready here
            # (a backward still running, or no batch): skip, so that the others' reduction does
            # not wait for this peer. Gradients that finish later go to the next round. A lone
            # peer does not skip: nobody waits for it, and each skip is a round of moolib's count
            # that holds the main thread (and the GIL) for about 2 ms; skipping at every turn of
            # the loop took a third of the GIL's time on Atari.
            accumulator.skip_gradients()
        return dropped

    def next_batch(self, queue):
        """The batch to learn from next: the last one again until it has had learner_passes
        passes (each on the weights the previous pass updated; V-trace corrects for the policy
        having moved), then a new one from the queue; None if there is none yet."""
        if self.passes_left > 0:
            self.passes_left -= 1
            return self.last_batch
        if not queue.ready():
            return None
        self.last_batch = queue.get()
        self.passes_left = self.flags.learner_passes - 1
        return self.last_batch

    def close(self):
        self.thread.shutdown()  # waits for a running batch


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
