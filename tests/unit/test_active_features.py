"""active_features.linear_on_active_features: the dense layer's outputs and gradients, whether
few or most of the features are silent, and the MinAtar net built on it."""

import math

import pytest
import torch
from torch.nn import functional as F

from examples.vtrace.active_features import linear_on_active_features
from examples.vtrace.models import MinAtarNet

ROWS, FEATURES, UNITS = 168, 1024, 256


def relu_features(active_columns, seed=0):
    """[ROWS, FEATURES] ReLU outputs, non-zero only in `active_columns` (and zero in about half
    of the rows there too, as a ReLU's outputs are)."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.zeros(ROWS, FEATURES)
    columns = torch.randperm(FEATURES, generator=generator)[:active_columns]
    features[:, columns] = torch.relu(torch.randn(ROWS, active_columns, generator=generator))
    return features


def layer(seed=1):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(UNITS, FEATURES, generator=generator) / math.sqrt(FEATURES)
    return weight.requires_grad_(), torch.randn(UNITS, generator=generator).requires_grad_()


def outputs_and_gradients(linear, features, weight, bias):
    features = features.clone().requires_grad_()
    output = linear(features, weight, bias)
    upstream = torch.randn(output.shape, generator=torch.Generator().manual_seed(2))
    return [output, *torch.autograd.grad(output, [features, weight, bias], upstream)]


# 0: all silent; 40 and 512: gathered (a half is the limit); 600 and 1024: the dense product.
@pytest.mark.parametrize("active_columns", [0, 40, 512, 600, 1024])
def test_same_outputs_and_gradients_as_the_dense_layer(active_columns):
    features = relu_features(active_columns)
    weight, bias = layer()
    expected = outputs_and_gradients(F.linear, features, weight, bias)
    got = outputs_and_gradients(linear_on_active_features, features, weight, bias)
    silent = features.sum(0) == 0
    # What the ReLU before the layer passes back of the features' gradient: nothing of a column
    # silent in every row (which may get 0 here where the dense layer's is not).
    for outputs in (expected, got):
        outputs[1][:, silent] = 0
    names = ["output", "features' gradient", "weight's gradient", "bias's gradient"]
    for name, want, have in zip(names, expected, got, strict=True):
        assert have.shape == want.shape, name
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5, msg=name)
    # A silent column's weights get exactly no gradient, as in the dense product.
    assert (got[2][:, silent] == 0).all()


def test_nan_and_infinity_in_a_feature_reach_the_output_as_in_the_dense_layer():
    weight, bias = layer()
    for bad in (math.nan, math.inf):
        features = relu_features(20)
        silent_column = int((features.sum(0) == 0).nonzero()[0])
        features[3, silent_column] = bad  # the only non-zero entry of its column
        dense = F.linear(features, weight, bias)
        gathered = linear_on_active_features(features, weight, bias)
        assert torch.equal(dense.isnan(), gathered.isnan())
        assert torch.equal(dense.isinf(), gathered.isinf())
        assert not gathered[3].isfinite().any() and gathered[4].isfinite().all()


def test_minatar_net_matches_the_dense_hidden_layer_on_sparse_frames():
    """The net's encode on frames that leave most conv features silent (a large negative conv
    bias, as trained MinAtar nets have) equals conv -> ReLU -> F.linear, gradients too."""
    torch.manual_seed(0)
    net = MinAtarNet((10, 10, 4), 3, hidden_size=256)
    with torch.no_grad():
        net.conv.bias.fill_(-0.6)
    frames = (torch.rand(ROWS, 10, 10, 4) < 0.1).to(torch.uint8)

    def dense_encode(obs):
        x = F.relu(net.conv(obs.permute(0, 3, 1, 2).float()).contiguous())
        return F.relu(F.linear(x.flatten(1), net.fc.weight, net.fc.bias))

    features = F.relu(net.conv(frames.permute(0, 3, 1, 2).float())).flatten(1)
    assert 0 < int((features.sum(0) != 0).sum()) <= FEATURES // 2  # the gathered path
    params = list(net.conv.parameters()) + list(net.fc.parameters())

    def hidden_and_gradients(encode):
        hidden = encode(frames)
        return [hidden, *torch.autograd.grad(hidden.square().sum(), params)]

    expected, got = hidden_and_gradients(dense_encode), hidden_and_gradients(net.encode)
    for want, have in zip(expected, got, strict=True):
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5)


def test_off_the_cpu_the_product_stays_dense_without_counting_columns():
    """Counting the active columns (nonzero) would make the CPU wait for a GPU: elsewhere than on
    the CPU the layer is F.linear. Meta tensors have no values, so nonzero() would fail on them."""
    features = torch.empty(ROWS, FEATURES, device="meta")
    weight, bias = (torch.empty(UNITS, FEATURES, device="meta"), torch.empty(UNITS, device="meta"))
    with pytest.raises(NotImplementedError):
        torch.nonzero(features)
    output = linear_on_active_features(features, weight, bias)
    assert output.device.type == "meta" and output.shape == (ROWS, UNITS)
