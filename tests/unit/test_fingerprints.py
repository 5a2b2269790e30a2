"""admission.py without a network: what a fingerprint holds, how two compare, and whom a
newcomer compares itself with."""

import pytest
import torch
from hydra import compose, initialize_config_dir

from examples.vtrace.admission import GroupMismatch, Lobby, differences, fingerprint
from examples.vtrace.config import CONFIG_DIR, plain


def flags(*overrides):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return plain(compose(config_name="config", overrides=["env.name=CartPole-v1", *overrides]))


def model(actions=2, hidden=64):
    return torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Linear(hidden, actions))


def test_settings_that_may_differ_per_peer_are_not_compared():
    mine = fingerprint(flags("actor_batch_size=8", "num_actor_cpus=2", "batch_size=8",
                             "device=cpu", "precision=bf16", "seed=5", "local_name=x",
                             "savedir=/elsewhere", "log_interval=1"), model())  # fmt: skip
    assert differences(mine, fingerprint(flags(), model())) == []


def test_each_difference_is_named():
    theirs = fingerprint(flags(), model())
    mine = fingerprint(flags("optimizer.learning_rate=10000", "unroll_length=7"), model(3))
    assert differences(mine, theirs) == [
        "optimizer.learning_rate=10000.0 here, 0.0006 in the group",
        "unroll_length=7 here, 20 in the group",
        "1.weight [3, 64] here, [2, 64] in the group",
        "1.bias [3] here, [2] in the group",
    ]
    many = differences(fingerprint(flags(), model(3, 32)), theirs)
    assert many[-1] == "1 more parameters differ" and len(many) == 4


@pytest.mark.parametrize(
    "override,default",
    [("center_frames=true", False), ("center_frames_on=background", "mean"),
     ("layer_norm=true", False)],
)  # fmt: skip
def test_a_net_setting_that_keeps_every_shape_still_differs(override, default):
    # The same parameters, another function of them: its gradients do not belong in the sum.
    mine = fingerprint(flags(override), model())
    key = override.split("=")[0]
    assert differences(mine, fingerprint(flags(), model())) == [
        f"{key}={getattr(flags(override), key)} here, {default} in the group"
    ]


def test_a_key_the_other_peer_does_not_know_is_not_a_difference():
    theirs = fingerprint(flags(), model())
    del theirs["settings"]["pg_clip"]
    assert differences(fingerprint(flags("pg_clip=0.2"), model()), theirs) == []


class FakeLobby(Lobby):
    def __init__(self, settings, started, name="me"):  # no Rpc, no Group
        self.name, self.group_name, self.started = name, "g", started
        self.fingerprint = fingerprint(flags(*settings), model())


def answer(settings, started, in_group):
    return {**fingerprint(flags(*settings), model()), "started": started, "in_group": in_group}


def test_the_peers_in_the_group_are_the_reference():
    lobby = FakeLobby(["entropy_cost=0.5"], started=100.0)
    # A peer that started later but already trains is the group: the newcomer is refused.
    with pytest.raises(GroupMismatch, match=r"compared with peer A\): entropy_cost=0.5 here"):
        lobby.check({"A": answer([], started=200.0, in_group=True)})


def test_before_anyone_trains_the_earlier_peer_sets_what_fits():
    answers = {"A": answer([], started=50.0, in_group=False)}
    with pytest.raises(GroupMismatch):
        FakeLobby(["entropy_cost=0.5"], started=100.0).check(answers)
    # The earlier one is let in: the later one will be refused when it compares.
    FakeLobby(["entropy_cost=0.5"], started=10.0).check(answers)
    # Alone, or with peers that fit: let in.
    FakeLobby([], started=100.0).check({})
    FakeLobby([], started=100.0).check(answers)
