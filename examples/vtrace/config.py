"""The V-trace experiment's settings: a Hydra structured config that types and documents every
key, and the checks that a type cannot express (ranges, and keys that must agree).

Every key can be overridden on the command line as key=value. The defaults are sized for a GPU
machine with about 10 free cores, as in moolib's original examples; the presets
(`preset=cartpole`, `preset=minatar`, ...) hold settings measured on a 2-core CPU machine.
"""

import os
import pathlib
import sys
import typing
from dataclasses import dataclass, field

import torch
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.config_repository import CachingConfigRepository
from hydra._internal.defaults_list import create_defaults_list
from hydra._internal.utils import (
    compute_search_path_dir,
    create_config_search_path,
    get_args_parser,
)
from hydra.core.config_search_path import SearchPathQuery
from hydra.core.config_store import ConfigStore
from hydra.core.object_type import ObjectType
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType
from hydra.errors import HydraException, MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from examples.common.address import parse_address
from examples.common.envs import check_env_name
from examples.vtrace.models import ATARI_NETS, PRECISIONS


class ConfigError(Exception):
    """A setting that cannot work; the message names the key and says what would."""


@dataclass
class EnvConfig:
    name: str = "ALE/Pong-v5"  # ALE/*, MinAtar/*, or a classic-control id such as CartPole-v1
    repeat_action_probability: float = 0.25  # sticky actions (Atari only)
    num_action_repeats: int = 4  # frame skip (Atari only)
    noop_max: int = 30  # random no-ops at reset (Atari only)
    # false: the game's own actions (6 for Pong), as ALE's v5 envs default to; true: all 18
    # joystick actions (this project's default before the key existed; checkpoints without it).
    full_action_space: bool = False


@dataclass
class OptimizerConfig:  # Adam
    learning_rate: float = 0.0006
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-8


@dataclass
class ExperimentConfig:
    connect: str = "127.0.0.1:4431"  # the broker (python -m moolib.broker)
    device: str = "auto"  # auto = cuda:0 when CUDA is available, else cpu
    savedir: str = "/tmp/moolib-vtrace/savedir"  # shared by the group: checkpoint.tar lives here
    localdir: str = "${savedir}/peers/${local_name}"  # this peer's own logs.tsv
    local_name: str = ""  # empty: peer<index> with peer=, else HOSTNAME-PID
    project: str = "moolib-vtrace"
    group: str = "default"
    entity: str = "moolib"  # with project and group, names the moolib Group and the wandb run
    wandb: bool = False  # true: log to wandb too (offline when there is no API key)
    tensorboard: bool = False  # true: also write logs.tsv's scalars for TensorBoard to localdir
    # This peer's index when a group starts at once: -m hydra/launcher=slurm peer='range(8)'
    # (README: Running on a cluster). It names the peer (local_name=peer<index>) and, with
    # device=auto, picks its GPU among those it shares with other peers.
    peer: int | None = None
    seed: int = 0

    env: EnvConfig = field(default_factory=EnvConfig)

    actor_batch_size: int = 128  # B of the acting model input [1, B, ...]
    num_actor_batches: int = 2  # 2 = double buffering: 2 x actor_batch_size envs
    num_actor_cpus: int = 10  # EnvPool worker processes
    batch_size: int = 32  # learner batch: B of [T, B, ...]
    unroll_length: int = 20  # learner T
    virtual_batch_size: int = 32  # least samples per optimizer step, summed over peers
    max_queued_batches: int = 2  # learner batches acted ahead before acting waits for learning
    learner_passes: int = 1  # optimizer steps per learner batch (2: learn from every batch twice)
    total_steps: int = 50_000_000  # env steps trained on, over the whole group

    discounting: float = 0.99
    baseline_cost: float = 0.5
    entropy_cost: float = 0.0006
    reward_clip: float = 1.0  # 0 = no clipping
    grad_norm_clipping: float = 40
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    warmup: int = 0  # env steps of linear learning-rate warm-up
    use_lstm: bool = False
    # The Atari torso: resnet (the IMPALA ResNet, for GPUs) or nature (the Nature-DQN CNN: a
    # sixth of the arithmetic, 5x the learner's samples/s on a CPU core; preset=atari_cpu).
    atari_net: str = "resnet"
    torch_threads: int = 1  # torch intra-op threads; 0 = torch's default (one per core)
    # fp32, or bf16 (the torso under bf16 autocast; weights, optimizer and checkpoints stay
    # fp32); auto: bf16 for the Atari ResNet on a CPU with bf16 instructions, else fp32.
    precision: str = "auto"

    log_interval: float = 10  # seconds between log rows and progress lines
    checkpoint_interval: float = 600  # seconds between checkpoint.tar writes (leader only)
    checkpoint_history_interval: float = 3600  # seconds between kept checkpoint_v<N>.tar copies


@dataclass
class EvaluateConfig(ExperimentConfig):
    """python -m examples.vtrace.evaluate: the env and model settings (env.*, use_lstm) come from
    the checkpoint's stored flags; of the experiment's keys only savedir, device, seed and
    torch_threads are read."""

    episodes: int = 10  # episodes to play
    greedy: bool = True  # true: argmax of the logits; false: sample from the policy
    video: str | None = None  # a folder: record each episode as episode_<i>.mp4 there
    checkpoint: str = "checkpoint.tar"  # a file name in savedir (checkpoint_v1200.tar) or a path
    max_episode_steps: int | None = None  # cap on agent steps per episode; null: the env's own


ConfigStore.instance().store(name="experiment_schema", node=ExperimentConfig)
ConfigStore.instance().store(name="evaluate_schema", node=EvaluateConfig)
CONFIG_DIR = pathlib.Path(__file__).parent
_MISSING = object()

POSITIVE_INTEGERS = ["actor_batch_size", "num_actor_batches", "num_actor_cpus", "batch_size",
                     "unroll_length", "virtual_batch_size", "total_steps", "max_queued_batches",
                     "learner_passes", "env.num_action_repeats"]  # fmt: skip
POSITIVE_NUMBERS = ["log_interval", "checkpoint_interval", "checkpoint_history_interval",
                    "optimizer.learning_rate"]  # fmt: skip


def check_flags(flags):
    """Reject settings that cannot work, before any process or connection is made."""
    try:
        parse_address(flags.connect)
    except ValueError as e:
        raise ConfigError(f"connect: {e}") from None
    try:
        check_env_name(flags.env.name)
    except ValueError as e:
        raise ConfigError(f"env.name: {e}") from None
    for keys, kind in [(POSITIVE_INTEGERS, "integer"), (POSITIVE_NUMBERS, "number")]:
        for key in keys:
            value = OmegaConf.select(flags, key)
            if not value > 0:
                raise ConfigError(f"{key} must be a positive {kind}, got {value}")
    if flags.num_actor_batches < 2:
        raise ConfigError("num_actor_batches must be at least 2 (one batch steps while we act)")
    envs = flags.actor_batch_size * flags.num_actor_batches
    if flags.num_actor_cpus > envs:
        raise ConfigError(
            f"num_actor_cpus={flags.num_actor_cpus} is more than the {envs} envs "
            f"(actor_batch_size x num_actor_batches); use at most {envs}"
        )
    if not 0 <= flags.discounting <= 1:
        raise ConfigError(f"discounting must be in [0, 1], got {flags.discounting}")
    if flags.precision not in ("auto", *PRECISIONS):
        raise ConfigError(f"precision must be auto, fp32 or bf16, got {flags.precision!r}")
    if flags.atari_net not in ATARI_NETS:
        raise ConfigError(f"atari_net must be {' or '.join(ATARI_NETS)}, got {flags.atari_net!r}")
    if flags.virtual_batch_size < flags.batch_size:
        raise ConfigError(
            f"virtual_batch_size ({flags.virtual_batch_size}) is less than batch_size "
            f"({flags.batch_size}): every optimizer step takes at least one learner batch"
        )


def check_command_line(
    program, schema, positive=POSITIVE_INTEGERS + POSITIVE_NUMBERS, argv=None, config_name="config"
):
    """Exit with one line when the command line cannot work: an override that names no key
    (batchsize=8), a value that does not fit its key's type (batch_size=ten), an option that a
    config group lacks (preset=nosuchpreset), or a misused Hydra flag; Hydra would say so in many
    lines or with a traceback. Hydra's flags are read with Hydra's own parser, so every form that
    Hydra takes (--cfg job, -c job, --info, -cn NAME, ...) passes as it is.

    `config_name` is the app's @hydra.main(config_name=...). Returns the arguments to hand on to
    Hydra as sys.argv[1:]."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_hydra_flags(program, argv)
    if args.experimental_rerun is not None:
        return argv  # Hydra reruns a stored config and ignores the overrides
    if args.shell_completion:
        check_shell_completion(program, args.overrides)  # its arguments are no overrides
        return argv
    parser = OverridesParser.create()
    overrides = [(arg, parse_override(program, parser, arg)) for arg in args.overrides]
    primary = args.config_name or config_name
    repo = config_repository(program, args, primary, [override for _, override in overrides])
    # The schema types the app's own config; another one (-cn, -cp) is left to Hydra to check.
    own_config = primary == config_name and args.config_path in (None, ".")
    config = OmegaConf.structured(schema)
    for arg, override in overrides:
        for element in sweep_elements(program, parser, arg, override):
            # Hydra's own rule: an override is a group choice when the group exists.
            if repo.group_exists(element.key_or_group) and not isinstance(element.value(), dict):
                check_group_choice(program, arg, element, repo, primary)
            elif own_config and not element.is_hydra_override():
                check_key(program, arg, element, config, schema, positive)
    if args.hydra_help:
        # Hydra composes its own help from its own config alone, where an override of the app's
        # config fails with a traceback (--hydra-help preset=cartpole): hand on only Hydra's.
        app_overrides = {arg for arg, override in overrides if not override.is_hydra_override()}
        return [arg for arg in argv if arg not in app_overrides]
    return argv


def parse_hydra_flags(program, argv):
    """Hydra's flags and overrides, read by the parser that hydra.main reads them with."""
    parser = get_args_parser()
    parser.error = lambda message: fail(program, message)  # not argparse's usage text
    args = parser.parse_args(argv)  # --version prints and exits here, as under Hydra
    # Hydra raises (a traceback) on these only once it runs; --help and --hydra-help come first.
    if args.help:
        return args
    if args.resolve and args.cfg is None:
        fail(program, "--resolve works only with --cfg or --help")
    if args.hydra_help:
        return args
    commands = {
        "--run": args.run,
        "--multirun": args.multirun,
        "--cfg": args.cfg is not None,
        "--info": args.info is not None,
        "--shell-completion": args.shell_completion,
    }
    given = [flag for flag, present in commands.items() if present]
    if len(given) > 1:
        fail(program, f"{' and '.join(given)}: give only one of {', '.join(commands)}")
    return args


def check_shell_completion(program, arguments):
    try:
        subcommands = OmegaConf.from_dotlist(arguments).keys() & {"install", "uninstall", "query"}
    except OmegaConfBaseException:
        subcommands = ()
    if len(subcommands) != 1:
        fail(program, "--shell-completion takes one of install=SHELL, uninstall=SHELL, query=SHELL")


def parse_override(program, parser, arg):
    try:
        [override] = parser.parse_overrides([arg])
    except HydraException as e:
        fail(program, f"{arg}: {first_line(e)}")
    return override


def sweep_elements(program, parser, arg, override):
    """The plain overrides that a sweep (seed=0,1, range(8), choice(...)) stands for, so that each
    value is checked as if given alone; [override] for a plain override."""
    if not override.is_sweep_override():
        return [override]
    if not override.is_discrete_sweep() or override.value_type == ValueType.GLOB_CHOICE_SWEEP:
        return [override]  # interval(), glob(): no list of values; the key is still checked
    key = override.get_key_element()
    return [
        parse_override(program, parser, f"{key}={text}")
        for text in override.sweep_string_iterator()
    ]


def config_repository(program, args, primary, overrides):
    """Hydra's view of the app's configs: the search path that hydra.main builds for the apps
    here (config_path=".", next to this file), with -cp, -cd and hydra.searchpath applied."""
    if args.config_dir is not None and not os.path.isdir(args.config_dir):
        fail(program, f"--config-dir {args.config_dir}: no such folder")
    search_dir = compute_search_path_dir(__file__, None, args.config_path or ".")
    if not search_dir.startswith("pkg://") and not os.path.isdir(search_dir):
        fail(program, f"--config-path {args.config_path}: no such folder ({search_dir})")
    search_path = create_config_search_path(search_dir)
    if args.config_dir is not None:  # where Hydra puts it: after the app's own folder
        search_path.prepend(
            provider="command-line",
            path=f"file://{os.path.abspath(args.config_dir)}",
            anchor=SearchPathQuery(provider="schema"),
        )
    loader = ConfigLoaderImpl(config_search_path=search_path)
    repo = CachingConfigRepository(loader.repository)
    try:  # Hydra's own step: hydra.searchpath (primary config or override) adds config folders
        loader._process_config_searchpath(primary, overrides, repo)
    except HydraException as e:
        fail(program, f"hydra.searchpath: {first_line(e)}")
    if not repo.config_exists(primary):
        names = [n for n in repo.get_group_options("", ObjectType.CONFIG) if not n.startswith("_")]
        fail(program, f"--config-name {primary}: no such config; choose from {', '.join(names)}")
    return repo


def check_group_choice(program, arg, override, repo, primary):
    """Fail unless the group override (preset=minatar, hydra/launcher=slurm) names options that
    exist and the primary config `primary` can take, as Hydra composes its defaults list."""
    try:
        create_defaults_list(repo, primary, [override], prepend_hydra=True, skip_missing=True)
    except MissingConfigException as e:
        group = override.key_or_group
        options = repo.get_group_options(group, ObjectType.CONFIG)
        chosen = override.value() if isinstance(override.value(), list) else [override.value()]
        if any(choice not in options for choice in chosen):
            fail(program, f"{arg}: no such {group}; choose from {', '.join(options)}")
        fail(program, f"{arg}: {first_line(e)}")  # a config that the chosen one names is missing
    except (HydraException, ValueError) as e:
        fail(program, f"{arg}: {first_line(e)}")


def check_key(program, arg, override, config, schema, positive):
    """Fail unless the override names a key of `config` (the app's schema) with a value of its
    type; `config` takes the value, so later overrides are checked against it."""
    key = override.key_or_group
    exists = OmegaConf.select(config, key, default=_MISSING) is not _MISSING
    if override.is_add() or (override.is_force_add() and not exists):
        return  # +key=value adds a key to the config
    if not exists:
        fail(program, f"{arg}: no such key (each key is documented in {CONFIG_DIR}/config.py)")
    if override.is_delete() or override.is_sweep_override():
        return
    try:
        OmegaConf.update(config, key, override.value(), merge=True)
    except OmegaConfBaseException:
        kind = expected_kind(schema, key, key in positive)
        fail(program, f"{arg}: {key} must be {kind}, got {override.value()!r}")


def expected_kind(schema, key, positive):
    """The kind of value that `key` of the dataclass `schema` takes, in words."""
    for part in key.split("."):
        schema = typing.get_type_hints(schema)[part]
    kinds = set(typing.get_args(schema)) - {type(None)} or {schema}
    words = {bool: "true or false", int: "an integer", float: "a number", str: "text"}
    if positive:
        words = {**words, int: "a positive integer", float: "a positive number"}
    text = " or ".join(words.get(kind, getattr(kind, "__name__", str(kind))) for kind in kinds)
    return f"{text} (or null)" if type(None) in typing.get_args(schema) else text


def first_line(error):
    """Hydra's messages go on for lines (search paths, hints); their first line names the
    problem."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def fail(program, message):
    print(f"{program}: error: {message}", file=sys.stderr)
    sys.exit(2)


def resolve_device(name):
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device={name!r} is not a torch device (try cpu or cuda:0)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"device={name} but CUDA is not available on this machine (torch "
            f"{torch.__version__}); use device=cpu, or install a CUDA build of torch"
        )
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ConfigError(f"device={name} but only {torch.cuda.device_count()} GPU(s) exist")
    return device


def check_writable(folder, name):
    """Create `folder` if needed and make sure a file can be written there; `name` is for errors."""
    folder = pathlib.Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"{name} is not writable ({e.strerror or e})") from None
