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


def scaled(batch_scaling, virtual_batch):
    config = flags()
    config.virtual_batch_size = 8
    config.optimizer.batch_scaling = batch_scaling
    return learning_rate(config, 0, virtual_batch)


@pytest.mark.parametrize("batch_scaling", ["none", "linear", "sqrt"])
def test_a_step_of_virtual_batch_size_unrolls_keeps_the_rate(batch_scaling):
    assert scaled(batch_scaling, 8) == pytest.approx(0.001)


def test_batch_scaling_follows_the_unrolls_of_the_step():
    assert scaled("none", 16) == pytest.approx(0.001)
    assert scaled("linear", 16) == pytest.approx(0.002)
    assert scaled("linear", 24) == pytest.approx(0.003)
    assert scaled("sqrt", 32) == pytest.approx(0.002)


def test_batch_scaling_must_name_a_choice():
    config = flags()
    config.optimizer.batch_scaling = "cubic"
    with pytest.raises(ConfigError, match="optimizer.batch_scaling must be one of none, linear"):
        check_flags(OmegaConf.structured(config))
