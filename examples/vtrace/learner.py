"""The thread that computes a V-trace peer's gradients while acting goes on, and hands them to the
group's Accumulator. The loss is in loss.py, the minibatches in minibatches.py, the optimizer
step in optimizer.py.

The experiment, the evaluator and the benchmark all take these from the same modules, so that
what is measured and evaluated is what trains.
"""

import collections
import concurrent.futures
import copy
import math
import threading
import time

import torch

from examples.common.torchscript import compiled
from examples.vtrace.loss import LOSS_NAMES, TracedGradients, entropy_cost, gradients
from examples.vtrace.minibatches import StepMinibatch, StepMinibatches, minibatches
from examples.vtrace.models import frames_for_encode

# A peer whose own gradients are not finite this many batches in a row stops (exit status 1):
# it has diverged, and its later batches would only be left out too.
MAX_NONFINITE_BATCHES = 20


class NonFiniteGradients(RuntimeError):
    """This peer's gradients kept coming out NaN or infinite; the message says what to do."""


def checked_gradients(flags, model, batch, entropy_weight=None, compute=gradients):
    """compute()'s gradients (gradients() or a TracedGradients), and whether every one of them
    is finite (checked in the learner thread). `batch` may be a StepMinibatch, whose steps are
    picked here, in the learner thread."""
    if isinstance(batch, StepMinibatch):
        batch = batch.steps(flags, model)
    grads, losses = compute(flags, model, batch, entropy_weight)
    return grads, losses, all_finite(grads)


@compiled
def copy_into(targets: list[torch.Tensor], sources: list[torch.Tensor]):
    # One call, without the GIL: one copy_ per tensor from Python took the GIL for each.
    with torch.no_grad():
        for index in range(len(targets)):
            targets[index].copy_(sources[index])


@compiled
def all_finite(tensors: list[torch.Tensor]) -> bool:
    # NaN and inf carry through a sum (so does a sum past 3e38, a diverged gradient too):
    # 0.1 ms against isfinite()'s 0.7 for MinAtar's net, whose whole minibatch takes 6-8.
    return bool(torch.stack([t.sum() for t in tensors]).isfinite().all())


def set_up_learner_thread(num_threads):
    """torch's intra-op thread count is the thread's own: the learner's stays the main thread's
    when the learner was made (torch_threads), when acting's changes (acting_threads). So is the
    CPU's flushing of subnormal floats to zero, which the learner's gradients and the optimizer
    need (see experiment.prepare), whichever thread made the learner."""
    torch.set_num_threads(num_threads)
    torch.set_flush_denormal(True)


class AsyncLearner:
    """Computes the gradients of learner batches in a second thread, so that acting goes on
    meanwhile (torch lets go of the GIL inside its kernels).

    The thread works on its own copy of the model, refreshed from the live weights when each
    batch starts: the optimizer and a state from the group change the live weights in place,
    under `weights_lock`. The next batch waits in the thread's queue behind the running one,
    so the thread goes on to it at once instead of waiting for the main thread to hand the
    last gradients over. A batch submitted before the group changed (another sync id) may
    have been computed on other weights than the group's, so its gradients are dropped rather
    than reduced.
    """

    def __init__(self, flags, model, wakeup=None):
        self.flags = flags
        self.wakeup = wakeup  # an Event set when a batch's gradients are done
        self.model = model
        self.model_copy = copy.deepcopy(model)
        # The copy's tensors and the live ones, refreshed before every batch: load_state_dict's
        # key matching cost more than the copies for MinAtar's 8 tensors.
        self.copied_tensors = [*self.model_copy.parameters(), *self.model_copy.buffers()]
        self.live_tensors = [*model.parameters(), *model.buffers()]
        self.compute = (
            TracedGradients(self.model_copy) if TracedGradients.fits(flags, model) else gradients
        )
        self.thread = concurrent.futures.ThreadPoolExecutor(
            1, "learner", initializer=set_up_learner_thread, initargs=(torch.get_num_threads(),)
        )
        # (future of checked_gradients(), the group's sync id when submitted), oldest first:
        # the first runs, the one behind it (at most one) waits in the thread's queue.
        self.jobs = collections.deque()
        # Held while the live weights change and while the thread copies them.
        self.weights_lock = threading.Lock()
        self.finished = None  # (gradients, sync id) not yet handed to the Accumulator
        self.losses = dict.fromkeys(LOSS_NAMES, math.nan)
        self.last_batch, self.passes_left = None, 0
        # Minibatches of the current pass not yet learned from (learner_minibatches > 1).
        self.pending = []
        self.shuffle = torch.Generator().manual_seed(flags.seed)
        self.minibatch_size = flags.batch_size // flags.learner_minibatches
        # (model version, sync id, batches) this peer reduced since the group's last step, until
        # the group steps past that version (or changes): see update(). A lone peer must be able
        # to fill a virtual batch by itself, so up to that many batches may go per step.
        self.in_flight = None
        self.batches_per_step = -(-flags.virtual_batch_size // self.minibatch_size)
        # Batches whose gradients were not finite and were kept from the group: in a row, and
        # since the last take_nonfinite_count().
        self.nonfinite_in_a_row, self.nonfinite = 0, 0
        # The mean acting version of the current batch's learned steps, and the policy lag of
        # each minibatch started since the last take_policy_lag().
        self.acting_version, self.lags = None, []

    def idle(self):
        return not self.jobs and self.finished is None

    def has_batch(self):
        """Whether a learner batch is not yet finished: passes or minibatches of it still to
        start, or gradients of it still to compute or to hand over."""
        return bool(self.passes_left or self.pending) or not self.idle()

    def start(self, batch, sync_id, env_train_steps=0):
        """Submit a batch to the thread, which starts on it when the batches before it are
        done, on the live weights of that moment."""
        entropy_weight = entropy_cost(self.flags, env_train_steps)
        future = self.thread.submit(self._gradients_on_live_weights, batch, entropy_weight)
        if self.wakeup is not None:
            future.add_done_callback(lambda _: self.wakeup.set())
        self.jobs.append((future, sync_id))

    def _gradients_on_live_weights(self, batch, entropy_weight):
        with self.weights_lock:
            copy_into(self.copied_tensors, self.live_tensors)
        return checked_gradients(self.flags, self.model_copy, batch, entropy_weight, self.compute)

    def wait(self, timeout):
        """Sleep up to `timeout` seconds, waking as soon as the oldest batch's gradients are
        done (a plain sleep left the learner thread idle for the rest of it), or, given a
        `wakeup` Event, as soon as it is set (by the learner thread or by whatever else the
        caller waits for)."""
        if self.wakeup is not None:
            if self.wakeup.wait(timeout):
                self.wakeup.clear()
        elif not self.jobs:
            time.sleep(timeout)
        else:
            concurrent.futures.wait([self.jobs[0][0]], timeout)

    def update(self, accumulator, sync_id, queue, alone=False, env_train_steps=0):
        """Hand finished gradients over when the Accumulator wants them, and submit the next
        learner batch (`env_train_steps`: the group's, for the schedules): when the thread is
        free and the Accumulator wants gradients, or behind the running batch. `alone`: this
        peer is the group's only member. Returns how many batches were dropped (0 or 1)
        because the group changed since they were submitted."""
        if self.jobs and self.finished is None and self.jobs[0][0].done():
            future, started_in = self.jobs.popleft()
            grads, self.losses, finite = future.result()
            if finite:
                self.nonfinite_in_a_row = 0
                self.finished = grads, started_in
            else:
                # Never into the group's sum, where it would be everyone's NaN: the group
                # would skip the step, but this peer's next batches would likely be NaN too.
                self.nonfinite_in_a_row += 1
                self.nonfinite += 1
                if self.nonfinite_in_a_row >= MAX_NONFINITE_BATCHES:
                    raise NonFiniteGradients(
                        f"{self.nonfinite_in_a_row} learner batches in a row gave NaN or "
                        "infinite gradients: this peer's model has diverged (try a lower "
                        "optimizer.learning_rate); it stops rather than learn nothing"
                    )
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
                accumulator.reduce_gradients(self.minibatch_size)
                batches = 1 if self.in_flight is None else self.in_flight[2] + 1
                self.in_flight = accumulator.model_version(), sync_id, batches
            else:
                dropped = 1
        if self.may_submit(accumulator):
            batch = self.next_batch(queue)
            if batch is not None:
                self.start(batch, sync_id, env_train_steps)
                if self.acting_version is not None:
                    self.lags.append(accumulator.model_version() - self.acting_version)
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

    def may_submit(self, accumulator):
        """Whether to submit another batch now: one behind a running one, so that the thread
        goes from batch to batch without waiting for the hand-over and the optimizer step in
        this thread (in idle MinAtar runs it waited for them a fifth of its time); and, with
        nothing running or waiting, a new one when the Accumulator wants gradients. Never more
        than two batches' gradients are running or waiting to be handed over.

        A lone peer's next batch learns on weights as old as before: moolib's Accumulator
        still wants gradients right after reduce_gradients (until its next update()), so that
        batch used to start before the optimizer step too. In a group, whose sum comes later,
        a queued batch may start before the group's step that it used to wait for, one step
        older."""
        outstanding = len(self.jobs) + (self.finished is not None)
        if outstanding >= 2:
            return False
        return bool(self.jobs) or (self.finished is None and accumulator.wants_gradients())

    def take_policy_lag(self):
        """The mean policy lag of the minibatches started since the last call (NaN if none):
        how many optimizer steps the weights that learned from them were ahead of the weights
        that acted their steps. V-trace corrects for the lag; the more there is, the more of
        its importance weights are clipped and the less each step can teach."""
        lags, self.lags = self.lags, []
        return torch.stack(lags).mean().item() if lags else math.nan

    def take_nonfinite_count(self):
        count, self.nonfinite = self.nonfinite, 0
        return count

    def next_batch(self, queue):
        """The batch to learn from next: the last one again until it has had learner_passes
        passes (each on the weights the previous pass updated; V-trace corrects for the policy
        having moved), then a new one from the queue; None if there is none yet. With
        learner_minibatches > 1, each pass is that many minibatches of the batch's unrolls, in
        a new random order every pass (PPO's epochs over shuffled minibatches)."""
        if not self.pending:
            if self.passes_left == 0:
                if not queue.ready():
                    return None
                batch = queue.get()
                # The last step's action is learned in the next unroll, not this one. Batches
                # made by hand (the tests') may carry no versions: no lag is counted for them.
                versions = batch.pop("acting_version", None) if isinstance(batch, dict) else None
                self.acting_version = None if versions is None else versions[:-1].float().mean()
                self.last_batch = frames_for_encode(self.model, batch)
                if self.flags.minibatch_steps:
                    self.last_batch = StepMinibatches(self.last_batch, self.shuffle)
                self.passes_left = self.flags.learner_passes
            self.passes_left -= 1
            count = self.flags.learner_minibatches
            if self.flags.minibatch_steps:
                self.pending = self.last_batch.one_pass(count)
            else:
                self.pending = minibatches(self.last_batch, count, self.shuffle)
        return self.pending.pop()

    def close(self):
        self.thread.shutdown()  # waits for a running batch
