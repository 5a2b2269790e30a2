"""The V-trace experiment's settings: a Hydra structured config that types and documents every
key, and the checks that a type cannot express (ranges, and keys that must agree).

Every key can be overridden on the command line as key=value. The defaults are sized for a GPU
machine with about 10 free cores, as in moolib's original examples; the presets
(`preset=cartpole`, `preset=minatar`, ...) hold settings measured on a 2-core CPU machine.
"""

import dataclasses
import os
import pathlib
from dataclasses import dataclass, field

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from examples.common.address import parse_address
from examples.common.envs import check_env_name
from examples.vtrace.models import ATARI_NETS, CENTER_FRAMES_ON, PRECISIONS


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
    # true: the step that loses a life of the game (Atari's lives) ends the learner's returns
    # there, as an episode's end does (the value of what follows is not added), while the game
    # itself goes on and its return is counted whole: the learning side of the EpisodicLifeEnv
    # of baselines' and CleanRL's Atari agents. Games without lives (Pong) are unchanged.
    episodic_life: bool = False


@dataclass
class OptimizerConfig:  # Adam
    learning_rate: float = 0.0006
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-8
    # The env step at which the rate's linear decay reaches 0; null: total_steps. A horizon past
    # total_steps keeps the rate up to the end (CleanRL's Atari PPO decays over 10M agent steps).
    decay_steps: int | None = None
    # How a step's rate follows the unrolls it learns from (its virtual batch, over all peers)
    # against virtual_batch_size: none; linear (x the ratio); sqrt. A lone peer's steps hold
    # virtual_batch_size unrolls, so this changes nothing for it; two peers' batches often land
    # in one step, and without it they take fewer, equally long steps per env step. linear
    # lifted two MinAtar peers on Breakout but kept Freeway's policy uniform (docs/results.md).
    batch_scaling: str = "none"


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
    # Added to the peer's own niceness (as `nice -n` adds) for the threads that step the envs in
    # the EnvPool's worker processes: where the cores are fewer than the busy threads, the
    # learner and acting, which wait on each other, then run first, and the envs take the rest.
    # preset=minatar: 10 (docs/results.md). 0: the envs run at the peer's own priority.
    env_worker_niceness: int = 0
    batch_size: int = 32  # learner batch: B of [T, B, ...]
    unroll_length: int = 20  # learner T
    virtual_batch_size: int = 32  # least samples per optimizer step, summed over peers
    # Learner batches acted ahead before acting waits for learning. 0: acting also waits while
    # the learner learns, so each batch is acted by the weights that learned the one before
    # (PPO's alternation; its optimizer steps then wait for acting in turn).
    max_queued_batches: int = 2
    # true: each actor batch is cut into groups of batch_size envs whose unrolls end on
    # different steps, so the learner's batches come one at a time instead of an actor batch's
    # worth at once: the learner waits less (a MinAtar run alone: 7.0 -> 5.9 minutes), but acting
    # waits less for it too, and the policy that acted lags further behind (SpaceInvaders: 8.3
    # -> 10.7 optimizer steps) and learned slower early (docs/results.md). preset=minatar has
    # them, with 128 envs and max_queued_batches=1. When batch_size does not divide
    # actor_batch_size, each whole actor batch is one group.
    unroll_groups: bool = False
    learner_passes: int = 1  # optimizer steps per learner batch (2: learn from every batch twice)
    # >1: every pass over a learner batch is that many optimizer steps, each on batch_size /
    # learner_minibatches of its unrolls in a random order (PPO's minibatches); virtual_batch_size
    # then counts minibatch unrolls.
    learner_minibatches: int = 1
    # true: each minibatch is single steps drawn from the whole learner batch (PPO's way), with
    # the V-trace targets and advantages computed once per batch, from the weights of its first
    # minibatch; false: whole unrolls, their targets computed in every minibatch. Needs
    # pg_clip > 0 and no LSTM.
    minibatch_steps: bool = False
    # true: PPO's ratio is taken against the policy at the start of learning each batch (the
    # weights of its first minibatch) instead of the policy that acted, and each step's term is
    # weighted by min(1, that policy's probability of the action / the acting policy's): the
    # decoupled PPO objective (Hilton et al. 2021). Acting runs up to max_queued_batches batches
    # ahead of learning, and the clip range is then centred on weights that many optimizer steps
    # old. Needs minibatch_steps=true.
    decoupled_clip: bool = False
    total_steps: int = 50_000_000  # env steps trained on, over the whole group

    discounting: float = 0.99
    baseline_cost: float = 0.5
    entropy_cost: float = 0.0006
    # The entropy cost at total_steps: it goes linearly from entropy_cost (at step 0) to this.
    # null keeps it constant. A high cost early keeps a fresh policy from settling on one action
    # before it has learned anything; a lower one later lets it act on what it has learned.
    entropy_cost_end: float | None = None
    # true: the policy gradient's advantages scaled to mean 0, std 1 over each learner batch
    normalize_advantages: bool = False
    # 0: IMPALA's V-trace policy gradient. >0: PPO's clipped surrogate on the V-trace advantages,
    # the ratio pi/mu clipped to [1 - pg_clip, 1 + pg_clip] (APPO), which keeps learner_passes > 1
    # from pushing the policy far from the one that acted.
    pg_clip: float = 0.0
    # The lambda of V-trace's traces (IMPALA's section 4.2: c_s = lambda * min(1, rho_s)); 1 is
    # the paper's V-trace, below 1 mixes in shorter returns as GAE's lambda does (PPO: 0.95).
    vtrace_lambda: float = 1.0
    reward_clip: float = 1.0  # 0 = no clipping
    grad_norm_clipping: float = 40
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    warmup: int = 0  # env steps of linear learning-rate warm-up
    use_lstm: bool = False
    # The Atari torso: resnet (the IMPALA ResNet, for GPUs), nature (the Nature-DQN CNN: a
    # sixth of the arithmetic, 5x the learner's samples/s on a CPU core) or nature_half (that
    # CNN at half its width: 2.4x nature's samples/s; preset=atari_cpu).
    atari_net: str = "resnet"
    # true: the Atari net's first layer sees each frame minus that frame's mean brightness.
    # Behind Pong's uniform background a first-layer channel whose weights sum below zero never
    # fires, so never learns (11-13 of 16 in the half-width net's Pong runs); centred, every
    # channel can (docs/atari.md). Checkpoints store it; other envs ignore it.
    center_frames: bool = False
    # What centring subtracts from each frame: "mean" (its mean brightness) or "background"
    # (its commonest grey level: Pong's brown court; Breakout's black, so nothing). The mean
    # puts Breakout's black below zero, which silenced channels there as Pong's court did
    # without centring (docs/atari.md). Checkpoints store it.
    center_frames_on: str = "mean"
    # true: the MinAtar net's hidden layer is layer-normalised before its ReLU, so a unit that
    # sits below zero on every frame still learns (without it, such a unit gets no gradient).
    # On Breakout it kept the units alive but learned no better (docs/results.md), so
    # preset=minatar leaves it off. Checkpoints store it; other envs' nets ignore it.
    layer_norm: bool = False
    # Units in the MinAtar net's hidden layer: 128 is the MinAtar paper's. Checkpoints store it;
    # other envs' nets ignore it.
    minatar_hidden: int = 128
    torch_threads: int = 1  # the learner's torch intra-op threads; 0: torch's (one per core)
    # Intra-op threads of acting's forward passes (the main thread); 0 = as torch_threads. With
    # one, acting's small passes never wait at OpenMP's barrier for a thread whose core the
    # learner or an env process holds (torch counts threads per thread).
    acting_threads: int = 0
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

BATCH_SCALINGS = ("none", "linear", "sqrt")
POSITIVE_INTEGERS = ["actor_batch_size", "num_actor_batches", "num_actor_cpus", "batch_size",
                     "unroll_length", "virtual_batch_size", "total_steps", "learner_passes",
                     "learner_minibatches", "env.num_action_repeats", "minatar_hidden"]  # fmt: skip
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
    check_numbers(flags)
    check_choices(flags)
    check_learner_batches(flags)


def check_numbers(flags):
    """Each number in its range, and the envs enough for the actor processes."""
    for keys, kind in [(POSITIVE_INTEGERS, "integer"), (POSITIVE_NUMBERS, "number")]:
        for key in keys:
            value = OmegaConf.select(flags, key)
            if not value > 0:
                raise ConfigError(f"{key} must be a positive {kind}, got {value}")
    for key in ("torch_threads", "acting_threads"):
        if not flags[key] >= 0:
            raise ConfigError(f"{key} must be 0 (torch's default) or more, got {flags[key]}")
    if not 0 <= flags.env_worker_niceness <= 19:
        raise ConfigError(
            f"env_worker_niceness must be 0 (the peer's own priority) to 19 (the lowest), "
            f"got {flags.env_worker_niceness}"
        )
    if not flags.max_queued_batches >= 0:
        raise ConfigError(
            f"max_queued_batches must be 0 (acting waits while the learner learns) or more, "
            f"got {flags.max_queued_batches}"
        )
    if flags.optimizer.decay_steps is not None and not flags.optimizer.decay_steps > 0:
        raise ConfigError(
            f"optimizer.decay_steps must be a positive integer or null (= total_steps), "
            f"got {flags.optimizer.decay_steps}"
        )
    if flags.entropy_cost_end is not None and not flags.entropy_cost_end >= 0:
        raise ConfigError(
            f"entropy_cost_end must be 0 or more, or null (constant entropy_cost), "
            f"got {flags.entropy_cost_end}"
        )
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
    if not 0 <= flags.vtrace_lambda <= 1:
        raise ConfigError(f"vtrace_lambda must be in [0, 1], got {flags.vtrace_lambda}")
    if not 0 <= flags.pg_clip < 1:
        raise ConfigError(
            f"pg_clip must be in [0, 1) (0 = off, PPO uses 0.1-0.3), got {flags.pg_clip}"
        )


def check_choices(flags):
    """Keys that name one of a few choices."""
    if flags.optimizer.batch_scaling not in BATCH_SCALINGS:
        names = ", ".join(BATCH_SCALINGS)
        raise ConfigError(
            f"optimizer.batch_scaling must be one of {names}, got {flags.optimizer.batch_scaling!r}"
        )
    if flags.precision not in ("auto", *PRECISIONS):
        raise ConfigError(f"precision must be auto, fp32 or bf16, got {flags.precision!r}")
    if flags.atari_net not in ATARI_NETS:
        names = ", ".join(ATARI_NETS)
        raise ConfigError(f"atari_net must be one of {names}, got {flags.atari_net!r}")
    if flags.center_frames_on not in CENTER_FRAMES_ON:
        names = ", ".join(CENTER_FRAMES_ON)
        raise ConfigError(
            f"center_frames_on must be one of {names}, got {flags.center_frames_on!r}"
        )


def check_learner_batches(flags):
    """How learner batches are cut into minibatches and optimizer steps."""
    if flags.batch_size % flags.learner_minibatches:
        raise ConfigError(
            f"batch_size ({flags.batch_size}) must be a multiple of learner_minibatches "
            f"({flags.learner_minibatches}): every minibatch has the same number of unrolls"
        )
    if flags.minibatch_steps and (flags.use_lstm or not flags.pg_clip):
        raise ConfigError(
            "minibatch_steps=true needs pg_clip > 0 (PPO's surrogate, the ratio taken in each "
            "minibatch) and use_lstm=false (single steps have no sequence for the LSTM)"
        )
    if flags.decoupled_clip and not flags.minibatch_steps:
        raise ConfigError(
            "decoupled_clip=true needs minibatch_steps=true: the policy at the start of a batch "
            "is read when the batch's targets are computed, once per batch"
        )
    minibatch = flags.batch_size // flags.learner_minibatches
    if flags.virtual_batch_size < minibatch:
        raise ConfigError(
            f"virtual_batch_size ({flags.virtual_batch_size}) is less than batch_size "
            f"({flags.batch_size}) / learner_minibatches ({flags.learner_minibatches}): every "
            "optimizer step takes at least one learner minibatch"
        )


def plain(flags):
    """The settings as an ExperimentConfig dataclass, interpolations resolved: the loop reads
    a dozen keys at every turn, and reading a DictConfig's key costs 10-20 us (a fifth of the
    main thread's time on Atari, and the GIL the learner thread waits for)."""
    return OmegaConf.to_object(flags) if OmegaConf.is_config(flags) else flags


def as_dict(flags):
    """The settings as nested dicts, for checkpoints and wandb; from a dataclass or a DictConfig."""
    if dataclasses.is_dataclass(flags):
        return dataclasses.asdict(flags)
    return OmegaConf.to_container(flags, resolve=True)


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
