"""A linear layer that multiplies only the features that are non-zero somewhere in the batch.

MinAtar's network feeds the ReLU of its convolution (16 x 8 x 8 = 1,024 features) to a hidden
layer of 256 units: its three products (forward, the weights' and the features' gradients) are
about a third of the learner's time. As an agent learns, most of those features go silent for
every frame: in the table's trained nets, 25-92 of the 1,024 were non-zero anywhere in a learner
batch of 168 frames on Freeway, about 190 on SpaceInvaders, 430-710 on Breakout and Asterix
(docs/results.md). A silent feature adds nothing to the product and gets no gradient through the
ReLU before it, so leaving it out changes no sum but the zeros it would add.
"""

import torch
from torch.nn import functional as F

from examples.common.torchscript import compiled


@compiled
def linear_on_active_features(
    features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """F.linear(features, weight, bias) for features [N, K] that are never negative (a ReLU's
    output), computed on a CPU on the columns that are non-zero in some row when those are at
    most half of them. The products shrink with the columns, but gathering them and scattering
    their gradients back has a cost of its own: for the forward and backward passes of 168 rows
    and 1,024 columns, 2.0 ms dense, 0.4 gathered at 32 active columns, 1.7 at 512, 2.3 at 768
    (docs/results.md). On a GPU, whose products are cheap and where counting the columns would
    make the CPU wait for the GPU, the product stays dense.

    A column whose sum is not 0 is active: for features >= 0 that is every column with a
    non-zero entry, NaN and infinity included, so they reach the output as in the dense
    product. A column silent in every row gets a zero gradient where F.linear's is not: the ReLU
    it came from passes none of it back either way."""
    if features.device.type != "cpu":
        return F.linear(features, weight, bias)
    active = (features.sum(0) != 0).nonzero().squeeze(1)
    if 2 * active.numel() > features.shape[1]:
        return F.linear(features, weight, bias)
    return torch.addmm(bias, features.index_select(1, active), weight.index_select(1, active).t())
