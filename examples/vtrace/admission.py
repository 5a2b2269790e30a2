"""Who may join a group: a peer whose model or settings do not fit the group's is refused at join.

A group's peers add up their gradients on one model, so they must agree on everything that shapes
those gradients: the env, the network (every parameter's name and shape), the optimizer and its
schedule, the loss and its costs, the unroll length, the learner passes. A peer started with
another env (another action count) or a wild learning rate would otherwise crash inside moolib or,
worse, train on and pour its gradients into everyone's steps.

Before joining the training group, every peer joins a lobby beside it (a second moolib Group,
`<group name>/lobby`, that never reduces anything) and answers one RPC there with its
fingerprint. A newcomer asks the lobby's other peers for theirs and compares with the peers that
already train, or, when none does yet, with those that started earlier: the group's first peer
sets what fits. A difference is a one-line error naming each setting and parameter that differs
(`policy.weight [3, 64] here, [2, 64] in the group`). The training group never sees the refused
peer. Settings that may differ per peer (the actor's batch sizes, the env processes, the device,
precision, seed, the learner's batch size, log and checkpoint intervals) are not compared.
"""

import json
import time

import moolib

from examples.vtrace.config import ConfigError, as_dict
from examples.vtrace.models import ARCHITECTURE_KEYS

# Settings every peer of a group must share (dotted keys; a section stands for all its keys).
# The net's keys are all here even where they leave every parameter's shape alone
# (center_frames): a peer with another would add gradients of another function.
SHARED_SETTINGS = [*ARCHITECTURE_KEYS, "env", "optimizer", "total_steps", "warmup",
                   "discounting", "baseline_cost", "entropy_cost", "entropy_cost_end",
                   "normalize_advantages",
                   "pg_clip", "vtrace_lambda", "reward_clip", "grad_norm_clipping",
                   "unroll_length", "learner_passes", "learner_minibatches",
                   "minibatch_steps", "decoupled_clip", "virtual_batch_size"]  # fmt: skip
FINGERPRINT_RPC = "vtrace.fingerprint"
ANSWER_TIMEOUT_S = 10  # a lobby member that does not answer by then is left out (it may be gone)
LOBBY_UPDATE_S = 0.25  # the broker drops a member that has not pinged for a few seconds
SHOWN_MODEL_DIFFERENCES = 3


class GroupMismatch(ConfigError):
    """This peer's model or settings differ from the group's; the message lists how."""


def fingerprint(flags, model):
    """What must agree across a group: the shared settings (flattened to dotted keys) and the
    name and shape of every parameter and buffer."""
    settings = as_dict(flags)
    shared = {}
    for key in SHARED_SETTINGS:
        value = settings.get(key)
        if isinstance(value, dict):
            shared.update({f"{key}.{sub}": v for sub, v in value.items()})
        else:
            shared[key] = value
    model_shapes = {name: list(tensor.shape) for name, tensor in model.state_dict().items()}
    return {"settings": shared, "model": model_shapes}


def differences(mine, theirs):
    """How `mine` differs from `theirs` (two fingerprints), one phrase per difference: settings
    first (they are usually the cause), then up to three parameters."""
    found = []
    for key, value in mine["settings"].items():
        # A key the other peer's code does not know yet is not a difference.
        if key in theirs["settings"] and theirs["settings"][key] != value:
            found.append(f"{key}={value} here, {theirs['settings'][key]} in the group")
    model = []
    for name, shape in mine["model"].items():
        if name not in theirs["model"]:
            model.append(f"{name} {shape} here, no {name} in the group")
        elif theirs["model"][name] != shape:
            model.append(f"{name} {shape} here, {theirs['model'][name]} in the group")
    model += [f"no {name} here, {shape} in the group"
              for name, shape in theirs["model"].items() if name not in mine["model"]]  # fmt: skip
    if len(model) > SHOWN_MODEL_DIFFERENCES:
        more = len(model) - SHOWN_MODEL_DIFFERENCES
        model = [*model[:SHOWN_MODEL_DIFFERENCES], f"{more} more parameters differ"]
    return found + model


class Lobby:
    """This peer's place in the group's lobby: its fingerprint for others to read, and the
    check of its own against the group's (`admitted()`)."""

    def __init__(self, rpc, group_name, flags, model):
        self.rpc = rpc
        self.name = flags.local_name
        self.group_name = group_name
        self.fingerprint = fingerprint(flags, model)
        self.started = time.time()
        self.in_group = False  # set once admitted: from then on this peer is a reference
        # Before the Group: others may ask as soon as they see this peer in the lobby.
        rpc.define(FINGERPRINT_RPC, self._answer)
        self.group = moolib.Group(rpc, f"{group_name}/lobby")
        self.asked = None  # {peer: future} of the answers awaited
        self.asked_at = 0.0
        self.last_update = 0.0

    def _answer(self):
        # As JSON text: moolib sends Python floats as 32-bit ones (0.002 would arrive as
        # 0.0020000000949949026 and differ from this peer's own 0.002).
        return json.dumps({**self.fingerprint, "started": self.started, "in_group": self.in_group})

    def update(self, now):
        if now - self.last_update >= LOBBY_UPDATE_S:
            self.last_update = now
            self.group.update()

    def admitted(self, now):
        """True once this peer may join the training group; False while the lobby's answers are
        awaited (or the broker is not reached yet). Raises GroupMismatch if it does not fit."""
        self.update(now)
        if not self.group.active():
            return False
        if self.asked is None:
            others = [peer for peer in self.group.members() if peer != self.name]
            self.asked = {peer: self.rpc.async_(peer, FINGERPRINT_RPC) for peer in others}
            self.asked_at = now
        if now - self.asked_at < ANSWER_TIMEOUT_S and not all(
            future.done() for future in self.asked.values()
        ):
            return False
        answers = {}
        for peer, future in self.asked.items():
            if future.done() and future.exception() is None:
                try:
                    answers[peer] = json.loads(future.result())
                except (TypeError, ValueError):  # a peer of other code: nothing to compare
                    continue
        self.check(answers)
        self.in_group = True
        return True

    def check(self, answers):
        """Raise GroupMismatch if this peer's fingerprint differs from the group's: that of the
        peers already training or, if none is yet, of those that started before this one."""
        references = {peer: a for peer, a in answers.items() if a["in_group"]}
        if not references:
            me = (self.started, self.name)
            references = {p: a for p, a in answers.items() if (a["started"], p) < me}
        for peer, answer in sorted(references.items()):
            found = differences(self.fingerprint, answer)
            if found:
                raise GroupMismatch(
                    f"this peer does not fit group {self.group_name} (compared with peer "
                    f"{peer}): {'; '.join(found)}; start it with the group's settings, or "
                    "in another group="
                )
