"""V-trace (IMPALA) with moolib: one peer of an elastic, data-parallel training run.

    python -m moolib.broker
    python -m examples.vtrace.experiment connect=BROKER_IP:BROKER_PORT \\
        savedir=/tmp/moolib-atari/savedir project=moolib-atari group=Zaxxon-Breakout \\
        env.name=ALE/Breakout-v5

Every process started with the same entity/project/group joins the same moolib Group: peers add
their gradients through an Accumulator, a newcomer receives the leader's learner state, and the
leader writes checkpoints to savedir. Each peer logs to its own localdir/logs.tsv.

One loop drives everything: act on one batch of envs while the other batch steps in the EnvPool
worker processes, hand finished unrolls to a Batcher, start learning from a learner batch when the
Accumulator wants gradients, and step the optimizer when the group's reduced gradients arrive.
The loss and backward of a batch run in a second thread, so that acting goes on meanwhile (torch
lets go of the GIL inside its kernels); the loop hands their gradients to the Accumulator.
"""

import concurrent.futures
import copy
import math
import os
import pathlib
import signal
import socket
import sys
import time
import zlib

import hydra
import moolib
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from examples.common import checkpoint, nest, vtrace
from examples.common.address import parse_address
from examples.common.envs import EnvFactory, check_env_name
from examples.common.stats import Stats, add_dicts
from examples.common.tsvlog import TsvLog
from examples.vtrace.models import create_model


class ConfigError(Exception):
    pass


def check_flags(flags):
    """Reject bad settings before any process or connection is made."""
    try:
        parse_address(flags.connect)
    except ValueError as e:
        raise ConfigError(f"connect: {e}") from None
    try:
        check_env_name(flags.env.name)
    except ValueError as e:
        raise ConfigError(f"env.name: {e}") from None
    for key in ["actor_batch_size", "num_actor_batches", "num_actor_cpus", "batch_size",
                "unroll_length", "virtual_batch_size", "total_steps", "max_queued_batches",
                "env.num_action_repeats"]:  # fmt: skip
        value = OmegaConf.select(flags, key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    for key in ["log_interval", "checkpoint_interval", "checkpoint_history_interval",
                "optimizer.learning_rate"]:  # fmt: skip
        value = OmegaConf.select(flags, key)
        if not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"{key} must be a positive number, got {value!r}")
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
    if flags.virtual_batch_size < flags.batch_size:
        raise ConfigError(
            f"virtual_batch_size ({flags.virtual_batch_size}) is less than batch_size "
            f"({flags.batch_size}): every optimizer step takes at least one learner batch"
        )


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


def prepare_dirs(flags):
    for key in ["savedir", "localdir"]:
        check_writable(flags[key], f"{key}={flags[key]}")


class Learner:
    """What a peer hands to newcomers and writes to checkpoints: weights, optimizer, counters."""

    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer
        # Exact and identical on every peer: grown by the reduced batch size at every update.
        self.env_train_steps = 0
        self.global_stats = Stats()  # all-reduced env steps and episode returns

    def state_dict(self):
        # On the CPU, so that a peer without a GPU can load what a GPU peer sends.
        return {
            "model": nest.map(lambda t: t.cpu(), self.model.state_dict()),
            "optimizer": nest.map(
                lambda t: t.cpu() if isinstance(t, torch.Tensor) else t,
                self.optimizer.state_dict(),
            ),
            "env_train_steps": self.env_train_steps,
            "global_stats": self.global_stats.to_dict(),
        }

    def load_state_dict(self, state):
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.env_train_steps = state["env_train_steps"]
        self.global_stats = Stats.from_dict(state["global_stats"])


def learning_rate(flags, env_train_steps):
    """Linear warm-up over `warmup` steps, then linear decay to 0 at total_steps."""
    scale = max(0.0, 1.0 - env_train_steps / flags.total_steps)
    if flags.warmup > 0:
        scale *= min(1.0, env_train_steps / flags.warmup)
    return flags.optimizer.learning_rate * scale


def compute_loss(flags, model, batch):
    """V-trace actor-critic loss on a learner batch of T+1 steps ([T+1, B, ...]).

    Step t holds observation t, whether it starts a new episode (done), the reward that led to
    it, the action taken from it and the acting policy's logits there.
    """
    core_state = batch.get("core_state", ())
    outputs, _ = model({"state": batch["state"], "done": batch["done"]}, core_state)
    logits = outputs["policy_logits"][:-1]
    values = outputs["baseline"][:-1]
    rewards = batch["reward"][1:]
    if flags.reward_clip:
        rewards = rewards.clamp(-flags.reward_clip, flags.reward_clip)
    discounts = (~batch["done"][1:]).float() * flags.discounting
    actions = batch["action"][:-1]
    returns = vtrace.from_logits(
        behavior_policy_logits=batch["policy_logits"][:-1],
        target_policy_logits=logits,
        actions=actions,
        discounts=discounts,
        rewards=rewards,
        values=values.detach(),
        bootstrap_value=outputs["baseline"][-1].detach(),
    )
    num_samples = actions.numel()
    pg_loss = vtrace.policy_gradient_loss(logits, actions, returns.pg_advantages) / num_samples
    baseline_loss = vtrace.baseline_loss(returns.vs - values) / num_samples
    entropy_loss = vtrace.entropy_loss(logits) / num_samples
    total = pg_loss + flags.baseline_cost * baseline_loss + flags.entropy_cost * entropy_loss
    stats = {"pg_loss": pg_loss.item(), "baseline_loss": baseline_loss.item(),
             "entropy_loss": entropy_loss.item()}  # fmt: skip
    return total, stats


def create_optimizer(flags, model):
    return torch.optim.Adam(
        model.parameters(),
        lr=flags.optimizer.learning_rate,
        betas=(flags.optimizer.beta_1, flags.optimizer.beta_2),
        eps=flags.optimizer.epsilon,
    )


def backward(flags, model, batch):
    """The gradients and losses of one learner batch; runs in the learner thread, on the learner's
    own copy of the model. The gradients are returned rather than left in .grad: the main thread
    hands them to the Accumulator."""
    loss, losses = compute_loss(flags, model, batch)
    return torch.autograd.grad(loss, list(model.parameters())), losses


def load_checkpoint(flags, learner):
    """Resume from savedir/checkpoint.tar if there is one; returns its model version or None."""
    path = pathlib.Path(flags.savedir) / "checkpoint.tar"
    if not path.exists():
        return None
    data = checkpoint.load(path)
    saved_env = data.get("flags", {}).get("env", {}).get("name")
    if saved_env and saved_env != flags.env.name:
        raise checkpoint.CheckpointError(
            f"{path} was trained on {saved_env}, not {flags.env.name}; "
            "use another savedir or the same env.name"
        )
    try:
        learner.load_state_dict(data)
    except (RuntimeError, KeyError, ValueError) as e:
        reason = str(e).strip().splitlines()[0]
        raise checkpoint.CheckpointError(
            f"{path} does not fit this model ({reason}); use another savedir or the same settings"
        ) from None
    return data["model_version"]


def save_checkpoint(flags, learner, model_version, history=False):
    data = learner.state_dict()
    data["model_version"] = model_version
    data["flags"] = OmegaConf.to_container(flags, resolve=True)
    savedir = pathlib.Path(flags.savedir)
    checkpoint.save_atomic(data, savedir / "checkpoint.tar")
    if history:
        checkpoint.save_atomic(data, savedir / f"checkpoint_v{model_version}.tar")


def start_wandb(flags):
    """Start a wandb run that can neither hang nor prompt: offline unless an API key is set."""
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    has_key = bool(os.environ.get("WANDB_API_KEY")) or (pathlib.Path.home() / ".netrc").exists()
    mode = os.environ.get("WANDB_MODE") or ("online" if has_key else "offline")
    kwargs = dict(
        project=flags.project, entity=flags.entity, group=flags.group, name=flags.local_name,
        config=OmegaConf.to_container(flags, resolve=True), dir=flags.localdir,
    )  # fmt: skip
    try:
        run = wandb.init(mode=mode, settings=wandb.Settings(init_timeout=30), **kwargs)
    except Exception as e:  # wandb raises many kinds; any of them means: go offline
        print(f"wandb: could not start online ({e}); logging offline instead")
        mode = "offline"
        run = wandb.init(mode=mode, **kwargs)
    if mode == "offline":
        run_dir = pathlib.Path(run.dir).parent  # run.dir is the run's files/ folder
        print(f"wandb: offline run in {run_dir}; upload it later with `wandb sync {run_dir}`")
    return run


def run(flags):
    if not flags.local_name:
        flags.local_name = f"{socket.gethostname()}-{os.getpid()}"
    check_flags(flags)
    device = resolve_device(flags.device)
    prepare_dirs(flags)
    torch.manual_seed(flags.seed)
    if flags.torch_threads > 0:
        # Intra-op threads that outnumber the free cores spin against the env processes.
        torch.set_num_threads(flags.torch_threads)
    group_name = f"{flags.entity}/{flags.project}/{flags.group}"
    print(f"Peer {flags.local_name} of {group_name} on {device}; logs in {flags.localdir}")

    # EnvPool forks its workers, and moolib refuses to fork once it has threads: it comes first.
    env_factory = EnvFactory(
        flags.env.name,
        # Distinct episodes on every peer; the same ones again for the same seed and local_name.
        seed=flags.seed * 1_000_003 + zlib.crc32(flags.local_name.encode()),
        repeat_action_probability=flags.env.repeat_action_probability,
        num_action_repeats=flags.env.num_action_repeats,
        noop_max=flags.env.noop_max,
    )
    observation_space, action_space = env_factory.spaces()
    model = create_model(observation_space, action_space.n, use_lstm=flags.use_lstm).to(device)
    optimizer = create_optimizer(flags, model)
    learner = Learner(model, optimizer)
    resumed_version = load_checkpoint(flags, learner)
    envs = moolib.EnvPool(
        env_factory,
        num_processes=flags.num_actor_cpus,
        batch_size=flags.actor_batch_size,
        num_batches=flags.num_actor_batches,
    )
    model.zero_grad(set_to_none=False)  # the Accumulator needs every .grad to exist

    rpc = moolib.Rpc()
    rpc.set_name(flags.local_name)
    rpc.connect(flags.connect)
    group = moolib.Group(rpc, group_name)
    accumulator = moolib.Accumulator("model", model.parameters(), model.buffers(), group=group)
    accumulator.set_virtual_batch_size(flags.virtual_batch_size)
    if resumed_version is not None:
        accumulator.set_model_version(resumed_version)
        print(f"Resumed from {flags.savedir}/checkpoint.tar at model version {resumed_version}")
    # Unrolls of actor_batch_size envs in, learner batches of batch_size out, along dim 1 (B).
    learn_batcher = moolib.Batcher(flags.batch_size, str(device), dim=1)

    log = TsvLog(pathlib.Path(flags.localdir) / "logs.tsv")
    wandb_run = start_wandb(flags) if flags.wandb else None
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _: stop.append(signal.Signals(signum).name))

    B = flags.actor_batch_size
    T = flags.unroll_length
    core_states = [model.initial_state(B) for _ in range(flags.num_actor_batches)]
    unrolls = [[] for _ in range(flags.num_actor_batches)]
    unroll_core = list(core_states)  # core state before each unroll's first step
    episode_returns = torch.zeros(flags.num_actor_batches, B)
    no_action = torch.zeros(B, dtype=torch.int64)
    futures = [envs.step(i, no_action) for i in range(flags.num_actor_batches)]
    queued_samples = 0  # in the Batcher, not yet learned from
    max_queued = flags.max_queued_batches * flags.batch_size
    local = Stats()  # since the last log row: this peer's numbers
    unreduced = Stats()  # not yet all-reduced into learner.global_stats
    losses = dict.fromkeys(["pg_loss", "baseline_loss", "entropy_loss"], math.nan)
    grad_norm, virtual_batch = math.nan, 0
    start = last_log = last_checkpoint = last_history = last_act = time.monotonic()
    stats_future, sent_stats, last_stats = None, Stats(), start
    last_wait_note = start - 7  # first note after 3 s: connecting takes a moment
    actor = 0
    learner_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="learner")
    # The learner thread works on its own copy of the model, refreshed before every batch: the
    # Accumulator and the optimizer change the weights in place whenever they need to.
    learner_model = copy.deepcopy(model)
    learning = None  # (future of backward(), the group's sync id when it started)
    gradients = None  # (gradients from backward() not yet handed to the Accumulator, sync id)

    while not stop:
        group.update()
        accumulator.update()
        now = time.monotonic()

        if not accumulator.connected():
            if now - last_wait_note > 10:
                print(f"Waiting for the broker at {flags.connect} ...", flush=True)
                last_wait_note = now
            time.sleep(0.05)
            # EnvPool workers give up after two minutes without an action.
            if now - last_act < 60:
                continue

        # A newcomer takes the leader's whole learner state, weights included.
        if accumulator.wants_state():
            accumulator.set_state(learner.state_dict())
        if accumulator.has_new_state():
            learner.load_state_dict(accumulator.state())
            print(f"Received the learner state at model version {accumulator.model_version()}")

        # Act on one batch of envs while the others step; pause while learning lags behind.
        if queued_samples < max_queued or now - last_act > 30:
            last_act = now
            # Copy out of the shared memory that the next step of this batch overwrites.
            env_out = {key: value.clone() for key, value in futures[actor].result().items()}
            step = {key: value.to(device) for key, value in env_out.items()}
            with torch.no_grad():
                inputs = {"state": step["state"].unsqueeze(0), "done": step["done"].unsqueeze(0)}
                outputs, core_after = model(inputs, core_states[actor])
            logits = outputs["policy_logits"][0]
            action = torch.multinomial(torch.softmax(logits, dim=-1), 1).squeeze(-1)
            futures[actor] = envs.step(actor, action.cpu())
            step["action"] = action
            step["policy_logits"] = logits
            core_before = core_states[actor]
            if not unrolls[actor]:
                unroll_core[actor] = core_before
            unrolls[actor].append(step)
            core_states[actor] = core_after

            done, reward = env_out["done"], env_out["reward"]
            episode_returns[actor] += reward
            finished = episode_returns[actor][done]
            for stats in (local, unreduced):
                stats.add("env_steps", B)
                stats.add("episode_return", finished.sum().item(), len(finished))
            episode_returns[actor][done] = 0

            if len(unrolls[actor]) == T + 1:
                if queued_samples < max_queued:
                    unroll = nest.map_many(lambda *xs: torch.stack(xs), *unrolls[actor])
                    if flags.use_lstm:
                        unroll["core_state"] = unroll_core[actor]
                    learn_batcher.cat(unroll)
                    queued_samples += B
                else:
                    local.add("dropped_unrolls", 1)
                # The last step of an unroll starts the next one, with the core state it had.
                unrolls[actor] = unrolls[actor][-1:]
                unroll_core[actor] = core_before
            actor = (actor + 1) % flags.num_actor_batches

        # Learn when the Accumulator takes gradients: backward in the learner thread, then the
        # all-reduce of the gradients in the background. Acting goes on through both.
        if learning is not None and learning[0].done():
            future, sync_id = learning
            learning = None
            grads, losses = future.result()
            gradients = grads, sync_id
        if gradients is not None and accumulator.wants_gradients():
            grads, sync_id = gradients
            gradients = None
            if group.sync_id() == sync_id:
                for param, grad in zip(model.parameters(), grads, strict=True):
                    param.grad.copy_(grad)
                accumulator.reduce_gradients(flags.batch_size)
            else:  # the group changed since the batch started and may have brought other weights
                local.add("dropped_batches", 1)
        if (learning is None and gradients is None and accumulator.wants_gradients()
                and not learn_batcher.empty()):  # fmt: skip
            batch = learn_batcher.get()
            queued_samples -= flags.batch_size
            learner_model.load_state_dict(model.state_dict())
            learning = learner_thread.submit(backward, flags, learner_model, batch), group.sync_id()
        elif queued_samples >= max_queued:
            time.sleep(0.001)  # waiting for the learner or the group's gradients

        if accumulator.has_gradients():
            virtual_batch = accumulator.get_gradient_stats()["batch_size"]
            learner.env_train_steps += virtual_batch * T
            for group_ in optimizer.param_groups:
                group_["lr"] = learning_rate(flags, learner.env_train_steps)
            grad_norm = nn.utils.clip_grad_norm_(model.parameters(), flags.grad_norm_clipping)
            optimizer.step()
            accumulator.zero_gradients()

        # Global stats: one all-reduce in flight at a time; a failed one is retried later.
        if stats_future is not None and stats_future.done():
            try:
                learner.global_stats += Stats.from_dict(stats_future.result())
            except Exception:  # the group changed under the reduction: send the numbers again
                unreduced += sent_stats
            stats_future = None
        if stats_future is None and now - last_stats >= flags.log_interval:
            last_stats = now
            sent_stats, unreduced = unreduced, Stats()
            stats_future = group.all_reduce("stats", sent_stats.to_dict(), add_dicts)

        if learner.env_train_steps >= flags.total_steps:
            stop.append(f"total_steps={flags.total_steps} reached")
        if now - last_log >= flags.log_interval or stop:
            elapsed = max(now - last_log, 1e-6)
            row = {
                "step": learner.env_train_steps,
                "env_train_steps": learner.env_train_steps,
                "model_version": accumulator.model_version(),
                "mean_episode_return": local.mean("episode_return"),
                "global_mean_episode_return": learner.global_stats.mean("episode_return"),
                "episodes": local.counts["episode_return"],
                "SPS": local.sum("env_steps") / elapsed,
                "local_env_steps": local.sum("env_steps"),
                "global_env_steps": learner.global_stats.sum("env_steps"),
                "virtual_batch_size": virtual_batch,
                "peers": len(group.members()),
                "is_leader": int(accumulator.is_leader()),
                "lr": optimizer.param_groups[0]["lr"],
                "grad_norm": float(grad_norm),
                **losses,
                "dropped_unrolls": local.sum("dropped_unrolls"),
                "dropped_batches": local.sum("dropped_batches"),
                "time": now - start,
            }
            log.write(row)
            if wandb_run is not None:
                wandb_run.log(row)
            print(
                f"steps {learner.env_train_steps:>10d} | SPS {row['SPS']:7.0f} | "
                f"return {row['mean_episode_return']:7.2f} | version {row['model_version']} | "
                f"peers {row['peers']} | leader {accumulator.get_leader()}",
                flush=True,
            )
            local = Stats()
            last_log = now

        if accumulator.is_leader() and now - last_checkpoint >= flags.checkpoint_interval:
            history = now - last_history >= flags.checkpoint_history_interval
            save_checkpoint(flags, learner, accumulator.model_version(), history=history)
            last_checkpoint = now
            if history:
                last_history = now

    learner_thread.shutdown()  # waits for a running backward
    if accumulator.is_leader() or not accumulator.connected():
        save_checkpoint(flags, learner, accumulator.model_version())
        print(f"Checkpoint written to {flags.savedir}/checkpoint.tar")
    log.close()
    if wandb_run is not None:
        wandb_run.finish()
    print(f"Stopped ({stop[0]}) at {learner.env_train_steps} env steps trained, "
          f"model version {accumulator.model_version()}")  # fmt: skip
    # moolib's objects point at each other: free them newest first, not in Python's order.
    del learn_batcher, accumulator, group, rpc
    return 0


@hydra.main(version_base=None, config_path=".", config_name="config")
def main(flags: DictConfig):
    try:
        return run(flags)
    except (ConfigError, checkpoint.CheckpointError) as e:
        print(f"experiment: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
