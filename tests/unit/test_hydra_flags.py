"""The command-line pre-check of the V-trace apps (command_line.py): Hydra's own flags pass in
every form Hydra takes, and what cannot work gets one line and exit status 2."""

import subprocess
import sys

import pytest
from helpers import REPO

from examples.vtrace.command_line import check_command_line
from examples.vtrace.config import EvaluateConfig, ExperimentConfig

APPS = {
    "experiment": dict(schema=ExperimentConfig, config_name="config"),
    "evaluate": dict(
        schema=EvaluateConfig, config_name="evaluate", positive=["episodes", "max_episode_steps"]
    ),
}
PRESETS = "choose from atari_cpu, cartpole, minatar"
LAUNCHERS = "choose from basic, local, slurm, submitit_local, submitit_slurm"


def check(program, *argv):
    return check_command_line(program, argv=list(argv), **APPS[program])


def refusal(capsys, program, *argv):
    """The status and the one stderr line with which the pre-check refuses `argv`."""
    with pytest.raises(SystemExit) as exit_info:
        check(program, *argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return exit_info.value.code, lines[0]


# Forms from Hydra's argument parser (hydra/_internal/utils.py: get_args_parser), flag values
# (job, config, NAME) included: once these were read as overrides and refused.
ACCEPTED = [
    ["--cfg", "job"],
    ["-c", "job"],
    ["--cfg=job"],
    ["--cfg", "hydra"],
    ["--cfg", "all", "--resolve"],
    ["--cfg", "job", "-p", "optimizer"],
    ["--cfg", "job", "--package", "env"],
    ["--help"],
    ["-h", "--resolve", "seed=3"],
    ["--hydra-help"],
    ["--info"],
    ["--info", "config"],
    ["--info", "defaults"],
    ["-i", "defaults-tree", "seed=1"],
    ["seed=1", "--info"],
    ["-m", "seed=0,1"],
    ["--multirun", "hydra/launcher=slurm", "peer=range(8)"],
    ["-m", "seed=interval(0,1)"],
    ["-cn", "config", "--cfg", "job"],
    ["--config-name", "evaluate", "--cfg", "job"],
    ["-cp", ".", "--cfg", "job"],
    ["-cd", "examples/vtrace", "--cfg", "job"],
    ["--config-dir=examples/vtrace", "-c", "job", "seed=2"],
    ["-sc", "install=bash"],
    ["--shell-completion", "uninstall=fish"],
    ["hydra/launcher=slurm", "--cfg", "hydra"],
    ["hydra.job.chdir=true", "seed=4", "optimizer.learning_rate=0.001"],
]


@pytest.mark.parametrize("program", APPS)
@pytest.mark.parametrize("argv", ACCEPTED, ids=" ".join)
def test_hydra_flags_pass_unchanged(program, argv, monkeypatch):
    monkeypatch.chdir(REPO)  # for -cd examples/vtrace
    assert check(program, *argv) == argv


@pytest.mark.parametrize("program", APPS)
def test_version_prints_and_exits_as_under_hydra(program, capsys):
    with pytest.raises(SystemExit) as exit_info:
        check(program, "--version")
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("Hydra 1.")


def test_hydra_help_gets_only_hydras_overrides():
    # Hydra composes --hydra-help from its own config alone: an override of the app's config
    # made it fail with a traceback.
    argv = ["--hydra-help", "preset=cartpole", "hydra/launcher=slurm", "batch_size=8"]
    assert check("experiment", *argv) == ["--hydra-help", "hydra/launcher=slurm"]


@pytest.mark.parametrize(
    "program, argv, message",
    [
        ("experiment", ["preset=nosuchpreset"], f"preset=nosuchpreset: no such preset; {PRESETS}"),
        ("experiment", ["--cfg", "job", "preset=nosuch"], f"no such preset; {PRESETS}"),
        ("experiment", ["+preset=nosuch"], f"+preset=nosuch: no such preset; {PRESETS}"),
        ("experiment", ["-m", "preset=cartpole,nosuch"], f"no such preset; {PRESETS}"),
        ("evaluate", ["preset=nosuchpreset"], f"preset=nosuchpreset: no such preset; {PRESETS}"),
        # evaluate.yaml lists no preset to override: Hydra's first line says so.
        ("evaluate", ["preset=cartpole"], "preset=cartpole: Could not override 'preset'"),
        ("experiment", ["hydra/launcher=nosuch"], f"no such hydra/launcher; {LAUNCHERS}"),
        ("evaluate", ["-m", "hydra/launcher=nosuch"], f"no such hydra/launcher; {LAUNCHERS}"),
        ("experiment", ["-cn", "nosuch"], "--config-name nosuch: no such config; choose from"),
        ("experiment", ["-cd", "no/such/dir"], "--config-dir no/such/dir: no such folder"),
        ("evaluate", ["-cp", "nosuch"], "--config-path nosuch: no such folder"),
    ],
)
def test_unknown_group_option_or_config_names_the_choices(capsys, program, argv, message):
    status, line = refusal(capsys, program, *argv)
    assert status == 2
    assert line.startswith(f"{program}: error: ") and message in line, line


@pytest.mark.parametrize("program", APPS)
@pytest.mark.parametrize(
    "argv, message",
    [
        (["batchsize=8"], "batchsize=8: no such key (each key is documented in"),
        (["--cfg", "job", "batchsize=8"], "batchsize=8: no such key"),
        (["-c", "job", "env.nme=Pong"], "env.nme=Pong: no such key"),
        (["--help", "batchsize=8"], "batchsize=8: no such key"),
        (["--info", "config", "batchsize=8"], "batchsize=8: no such key"),
        (["--hydra-help", "batchsize=8"], "batchsize=8: no such key"),
        (["-cd", "examples/vtrace", "batchsize=8"], "batchsize=8: no such key"),
        (["-m", "batchsize=8,9"], "batchsize=8,9: no such key"),
        (["~nosuch"], "~nosuch: no such key"),
        (["--cfg", "job", "batch_size=ten"], "batch_size=ten: batch_size must be "),
        (["-m", "batch_size=8,ten"], "batch_size=8,ten: batch_size must be "),
        (["-m", "wandb=true,maybe"], "wandb=true,maybe: wandb must be true or false"),
        (["seed=["], "seed=[: "),
    ],
)
def test_bad_keys_and_values_keep_one_line_beside_hydra_flags(
    capsys, monkeypatch, program, argv, message
):
    monkeypatch.chdir(REPO)
    status, line = refusal(capsys, program, *argv)
    assert status == 2
    assert line.startswith(f"{program}: error: ") and message in line, line


def test_positive_keys_are_named_positive(capsys):
    assert (
        "batch_size must be a positive integer, got 'ten'"
        in refusal(capsys, "experiment", "-c", "job", "batch_size=ten")[1]
    )
    assert (
        "episodes must be a positive integer, got 'ten'"
        in refusal(capsys, "evaluate", "--cfg", "job", "episodes=ten")[1]
    )


@pytest.mark.parametrize("program", APPS)
def test_keys_are_checked_when_config_name_names_the_apps_own(capsys, program):
    own = APPS[program]["config_name"]
    line = refusal(capsys, program, "-cn", own, "--cfg", "job", "batchsize=8")[1]
    assert "batchsize=8: no such key" in line


def test_keys_of_another_primary_config_are_left_to_hydra():
    # -cn evaluate gives the experiment app evaluate.yaml, whose keys its schema does not know.
    assert check("experiment", "-cn", "evaluate", "--cfg", "job", "episodes=3")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--cfg", "nosuch"], "argument --cfg/-c: invalid choice: 'nosuch'"),
        (["--info", "nosuch"], "argument --info/-i: invalid choice: 'nosuch'"),
        (["--nosuch"], "unrecognized arguments: --nosuch"),
        # Hydra's parser takes the overrides in one run, before or after the flags.
        (["seed=1", "--cfg", "job", "batch_size=8"], "unrecognized arguments: batch_size=8"),
        (["-cn"], "argument --config-name/-cn: expected one argument"),
        # Hydra raises these with a traceback once it runs.
        (["-m", "seed=0,1", "--cfg", "job"], "--multirun and --cfg: give only one of"),
        (["--cfg", "job", "--info"], "--cfg and --info: give only one of"),
        (["--resolve"], "--resolve works only with --cfg or --help"),
        (["--shell-completion"], "--shell-completion takes one of install=SHELL"),
    ],
)
def test_misused_hydra_flags_get_one_line(capsys, argv, message):
    status, line = refusal(capsys, "experiment", *argv)
    assert status == 2
    assert line.startswith("experiment: error: ") and message in line, line


# --- The apps themselves: Hydra acts on the flags and exits before main() trains ----------


def run_app(program, *args):
    command = [sys.executable, "-m", f"examples.vtrace.{program}", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    return result


@pytest.mark.parametrize(
    "program, args, expected",
    [
        ("experiment", ["--cfg", "job"], "batch_size: 32"),
        ("experiment", ["-c", "job", "preset=cartpole"], "name: CartPole-v1"),
        ("evaluate", ["--cfg", "job"], "episodes: 10"),
        ("evaluate", ["-c", "job", "-p", "optimizer"], "# @package optimizer"),
        ("experiment", ["--cfg", "hydra", "hydra/launcher=slurm"], "submitit"),
        ("experiment", ["--help"], "experiment is powered by Hydra."),
        ("evaluate", ["-h"], "evaluate is powered by Hydra."),
        ("experiment", ["--hydra-help", "preset=cartpole"], "== Configuration groups =="),
        ("evaluate", ["--hydra-help"], "hydra/launcher: basic, local, slurm"),
        ("experiment", ["--info"], "Config search path"),
        ("evaluate", ["--info", "defaults"], "Defaults List"),
        ("experiment", ["-cd", "examples/vtrace", "-cn", "evaluate", "-c", "job"], "episodes:"),
        ("evaluate", ["--config-name", "config", "--cfg", "job"], "batch_size: 32"),
    ],
)
def test_app_shows_what_the_flag_asks_for(program, args, expected):
    result = run_app(program, *args)
    assert result.returncode == 0, result.stderr
    assert expected in result.stdout, result.stdout


@pytest.mark.parametrize(
    "program, args, message",
    [
        ("experiment", ["preset=nosuchpreset"], f"no such preset; {PRESETS}"),
        ("evaluate", ["preset=nosuchpreset"], f"no such preset; {PRESETS}"),
        ("experiment", ["--cfg", "job", "batchsize=8"], "batchsize=8: no such key"),
        (
            "evaluate",
            ["-c", "job", "hydra/launcher=nosuch"],
            f"no such hydra/launcher; {LAUNCHERS}",
        ),
    ],
)
def test_app_refuses_in_one_line(program, args, message):
    result = run_app(program, *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert lines[0].startswith(f"{program}: error: ")


def test_sweep_passes_the_check_and_reaches_main(tmp_path):
    # Each job stops in main's own settings check (batch_size=0), so nothing trains.
    result = run_app("experiment", "-m", "seed=0,1", "batch_size=0", f"savedir={tmp_path}")
    assert result.returncode == 2
    assert "batch_size must be a positive integer, got 0" in result.stderr, result.stderr
    assert (tmp_path / "hydra" / "multirun.yaml").exists()  # Hydra's sweep folder
