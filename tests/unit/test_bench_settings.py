"""python -m bench --set KEY=VALUE: each value takes the type of the setting's default, and the
learner limit counts every env step learner_passes times."""

import pytest

from bench.__main__ import VTRACE_SETTINGS, parse_args


def test_values_take_their_defaults_types():
    args = parse_args(
        ["--only", "limits", "--set", "pg_clip=0.2", "--set", "normalize_advantages=false",
         "--set", "batch_size=8", "--set", "atari_net=nature"]
    )  # fmt: skip
    assert args.settings["pg_clip"] == 0.2
    assert args.settings["normalize_advantages"] is False
    assert args.settings["batch_size"] == 8
    assert args.settings["atari_net"] == "nature"
    assert args.settings["unroll_length"] == VTRACE_SETTINGS["unroll_length"]


@pytest.mark.parametrize(
    "item", ["pg_clip=x", "batch_size=2.5", "normalize_advantages=maybe", "atari_net=dqn", "nope=1"]
)
def test_a_value_of_the_wrong_type_is_one_line_and_exit_2(item, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--only", "limits", "--set", item])
    assert exit_info.value.code == 2
    assert f"--set {item!r}" in capsys.readouterr().err


def test_the_bench_measures_the_atari_cpu_preset():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from examples.vtrace.config import CONFIG_DIR

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        preset = compose(config_name="config", overrides=["preset=atari_cpu"])
    differ = {
        key: (value, OmegaConf.select(preset, key))
        for key, value in VTRACE_SETTINGS.items()
        if OmegaConf.select(preset, key) != value
    }
    assert differ == {}
