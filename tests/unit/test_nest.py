from collections import OrderedDict, namedtuple

import pytest
import torch

from examples.common import nest

Step = namedtuple("Step", ["obs", "reward"])


def make_nest():
    return {
        "z": torch.tensor([1.0]),  # not alphabetical: insertion order must win
        "a": [torch.tensor([2.0]), (torch.tensor([3.0]), torch.tensor([4.0]))],
        "step": Step(obs=torch.tensor([5.0]), reward=torch.tensor([6.0])),
    }


def test_map_preserves_structure_and_types():
    out = nest.map(lambda t: t * 10, make_nest())
    assert list(out.keys()) == ["z", "a", "step"]
    assert isinstance(out["a"], list) and isinstance(out["a"][1], tuple)
    assert isinstance(out["step"], Step)
    assert out["step"].reward.item() == 60.0
    assert [t.item() for t in nest.flatten(out)] == [10, 20, 30, 40, 50, 60]


def test_map_keeps_ordered_dict():
    out = nest.map(lambda x: x + 1, OrderedDict(b=1, a=2))
    assert isinstance(out, OrderedDict) and list(out.items()) == [("b", 2), ("a", 3)]


def test_map_on_leaf():
    assert nest.map(lambda x: x + 1, 1) == 2


def test_flatten_order():
    assert [t.item() for t in nest.flatten(make_nest())] == [1, 2, 3, 4, 5, 6]


def test_pack_as_roundtrip():
    original = make_nest()
    packed = nest.pack_as(original, [t + 1 for t in nest.flatten(original)])
    assert isinstance(packed["step"], Step)
    assert [t.item() for t in nest.flatten(packed)] == [2, 3, 4, 5, 6, 7]


def test_pack_as_wrong_length():
    with pytest.raises(ValueError):
        nest.pack_as([1, 2], [1])
    with pytest.raises(ValueError):
        nest.pack_as([1, 2], [1, 2, 3])


def test_map_many_stacks_a_list_of_nests():
    steps = [make_nest(), nest.map(lambda t: t + 100, make_nest())]
    stacked = nest.map_many(lambda *ts: torch.stack(ts), *steps)
    assert isinstance(stacked["step"], Step)
    assert stacked["a"][1][0].shape == (2, 1)
    assert stacked["a"][1][0].flatten().tolist() == [3.0, 103.0]


def test_map_many_rejects_mismatched_structures():
    with pytest.raises(ValueError):
        nest.map_many(lambda a, b: a + b, {"x": 1}, {"y": 1})
    with pytest.raises(ValueError):
        nest.map_many(lambda a, b: a + b, [1, 2], [1])
    with pytest.raises(ValueError):
        nest.map_many(lambda a, b: a + b, [1], (1,))
