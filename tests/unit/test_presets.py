"""The preset config group: preset=NAME changes only what the preset says, no preset keeps the
defaults, and command-line overrides still win over a preset."""

import pytest
from hydra import compose, initialize_config_dir

from examples.vtrace.config import CONFIG_DIR, check_flags  # also registers the schema
from examples.vtrace.loss import entropy_cost

PRESETS = sorted(p.stem for p in (CONFIG_DIR / "preset").glob("*.yaml"))


def config(*overrides):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def test_the_presets_are_there():
    assert {"minatar", "cartpole", "atari_cpu"} <= set(PRESETS)


def test_no_preset_is_the_default_config():
    flags = config()
    assert flags.env.name == "ALE/Pong-v5"
    assert flags.actor_batch_size == 128 and flags.total_steps == 50_000_000


def test_minatar_preset():
    flags = config("preset=minatar", "env.name=MinAtar/Seaquest-v1")
    assert flags.env.name == "MinAtar/Seaquest-v1"
    assert flags.device == "cpu" and flags.num_actor_cpus == 1
    assert flags.total_steps == 5_000_000 and flags.reward_clip == 0
    # Breakout's seeds levelled off near 24 with the MinAtar paper's 128 units (docs/results.md)
    assert flags.minatar_hidden == 256


def test_minatar_preset_looks_far_ahead_and_explores_less_as_it_learns():
    flags = config("preset=minatar")
    # Seaquest's surfacing pays off over the next ~200 steps (docs/results.md).
    assert flags.discounting == 0.995
    assert flags.vtrace_lambda == 0.95  # shorter traces: every screened seed above AC(lambda)
    start, middle, end = (entropy_cost(flags, s * flags.total_steps) for s in (0, 0.5, 1))
    assert start == pytest.approx(0.03) and end == pytest.approx(0.003)
    assert middle == pytest.approx((start + end) / 2)


def test_minatar_preset_acts_for_128_envs_in_groups_of_one_learner_batch():
    flags = config("preset=minatar")
    assert flags.actor_batch_size * flags.num_actor_batches == 128
    assert flags.unroll_groups and flags.actor_batch_size % flags.batch_size == 0
    # acting waits once one learner batch is queued (a Seaquest seed stalled with two)
    assert flags.max_queued_batches == 1


def test_command_line_beats_the_preset():
    flags = config("preset=minatar", "batch_size=32", "optimizer.learning_rate=0.01")
    assert flags.batch_size == 32 and flags.optimizer.learning_rate == 0.01


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_passes_the_flag_checks(preset):
    check_flags(config(f"preset={preset}"))


def test_atari_cpu_preset_keeps_atari():
    flags = config("preset=atari_cpu", "env.name=ALE/Breakout-v5")
    assert flags.env.name == "ALE/Breakout-v5" and flags.actor_batch_size == 16
    # CleanRL's PPO batch of 1,024 samples, from 32 envs x 32 steps.
    assert flags.batch_size * flags.unroll_length == 1024 and flags.learner_passes == 3
    # PPO's way of learning: acting waits for learning, minibatches of single steps.
    assert flags.max_queued_batches == 0 and flags.minibatch_steps and flags.pg_clip == 0.1
    # A lost life ends the learner's returns, as in the PPO runs its Breakout is compared with.
    assert flags.env.episodic_life
    # Every first-layer channel can fire behind a uniform background, and a black one stays at
    # zero; Pong's seed 0 needed twice PPO's entropy cost not to settle on one action.
    assert flags.center_frames and flags.center_frames_on == "background"
    assert flags.entropy_cost == 0.02
    # Acting does not share its small forward passes with a thread an env process keeps waiting.
    assert flags.torch_threads == 2 and flags.acting_threads == 1


def test_the_loop_reads_a_plain_dataclass_with_the_same_settings():
    from omegaconf import OmegaConf

    from examples.vtrace.config import ExperimentConfig, as_dict, plain

    flags = config("preset=atari_cpu", "local_name=peer3")
    fast = plain(flags)
    assert isinstance(fast, ExperimentConfig) and plain(fast) is fast
    assert fast.localdir == f"{flags.savedir}/peers/peer3"  # interpolations resolved
    assert fast.optimizer.learning_rate == flags.optimizer.learning_rate
    # Checkpoints and wandb store the same dict from either form.
    assert as_dict(fast) == as_dict(flags) == OmegaConf.to_container(flags, resolve=True)


@pytest.mark.parametrize("value", [-0.1, 1.0, 2.0])
def test_pg_clip_out_of_range_is_refused(value):
    from examples.vtrace.config import ConfigError

    with pytest.raises(ConfigError, match="pg_clip must be in"):
        check_flags(config(f"pg_clip={value}"))


@pytest.mark.parametrize("value", [-0.5, 1.5])
def test_vtrace_lambda_out_of_range_is_refused(value):
    from examples.vtrace.config import ConfigError

    with pytest.raises(ConfigError, match="vtrace_lambda must be in"):
        check_flags(config(f"vtrace_lambda={value}"))


def test_batch_size_must_divide_into_minibatches():
    from examples.vtrace.config import ConfigError

    with pytest.raises(ConfigError, match="multiple of learner_minibatches"):
        check_flags(config("batch_size=10", "virtual_batch_size=10", "learner_minibatches=4"))
    with pytest.raises(ConfigError, match="at least one learner minibatch"):
        check_flags(config("batch_size=16", "virtual_batch_size=2", "learner_minibatches=4"))
    check_flags(config("batch_size=16", "virtual_batch_size=4", "learner_minibatches=4"))


def test_center_frames_on_must_name_what_is_subtracted():
    from examples.vtrace.config import ConfigError

    with pytest.raises(ConfigError, match="center_frames_on must be one of mean, background"):
        check_flags(config("center_frames_on=median"))
    check_flags(config("center_frames_on=background"))
