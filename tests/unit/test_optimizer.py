"""The learning-rate schedule: warm-up, then a linear decay that reaches 0 at
optimizer.decay_steps, or at total_steps when that is null."""

import pytest
from omegaconf import OmegaConf

from examples.vtrace.config import ConfigError, ExperimentConfig, OptimizerConfig, check_flags
from examples.vtrace.optimizer import learning_rate


def flags(decay_steps=None, warmup=0):
    optimizer = OptimizerConfig(learning_rate=0.001, decay_steps=decay_steps)
    return ExperimentConfig(total_steps=1000, warmup=warmup, optimizer=optimizer)


def test_without_decay_steps_the_rate_reaches_zero_at_total_steps():
    rates = [learning_rate(flags(), step) for step in (0, 500, 1000, 2000)]
    assert rates == pytest.approx([0.001, 0.0005, 0.0, 0.0])


def test_decay_steps_past_total_steps_keeps_the_rate_up_to_the_end():
    rates = [learning_rate(flags(decay_steps=4000), step) for step in (0, 1000, 4000, 5000)]
    assert rates == pytest.approx([0.001, 0.00075, 0.0, 0.0])


def test_warmup_scales_the_decayed_rate():
    assert learning_rate(flags(decay_steps=4000, warmup=200), 100) == pytest.approx(
        0.001 * (1 - 100 / 4000) * 0.5
    )


@pytest.mark.parametrize("bad", [0, -5])
def test_decay_steps_must_be_positive(bad):
    with pytest.raises(ConfigError, match="optimizer.decay_steps"):
        check_flags(OmegaConf.structured(flags(decay_steps=bad)))
