"""What the machine allows the V-trace agent, each measured alone in a fresh process:

* env limit: random actions through moolib.EnvPool, no model at all;
* learner limit: the experiment's own learner step (loss, gradients, clipping, Adam) on random
  batches, in a second thread as in the experiment; with its FLOP count and GFLOP/s;
* acting limit: the acting model's inference on actor batches, as the actor runs it.

The learner and acting limits are measured for today's settings and for the settings of
earlier versions ("before": fp32, contiguous activations) in alternating rounds
of one process, so that drift on a shared machine hits both alike."""

import concurrent.futures
import contextlib
import multiprocessing
import time

import moolib
import numpy as np
import torch
from omegaconf import OmegaConf
from torch.utils.flop_counter import FlopCounterMode

from bench.machine import MATMUL_SIZE, measure_peak
from examples.common.envs import EnvFactory
from examples.vtrace.actor import use_acting_threads
from examples.vtrace.config import ExperimentConfig
from examples.vtrace.loss import gradients
from examples.vtrace.models import (
    PRECISIONS,
    architecture,
    bf16_supported,
    create_model,
    frames_for_encode,
)
from examples.vtrace.optimizer import create_optimizer, step_optimizer
from examples.vtrace.state import LearnerState


def experiment_flags(settings):
    """The experiment's config (its defaults) with the benchmark's settings."""
    flags = OmegaConf.structured(ExperimentConfig)
    for key, value in settings.items():
        OmegaConf.update(flags, key, value)
    return flags


def env_factory(env_name, flags, seed=0):
    """The experiment's envs (its env.* settings) for env_name."""
    return EnvFactory(
        env_name,
        seed=seed,
        repeat_action_probability=flags.env.repeat_action_probability,
        num_action_repeats=flags.env.num_action_repeats,
        noop_max=flags.env.noop_max,
        full_action_space=flags.env.full_action_space,
    )


def in_fresh_process(fn, *args):
    """fn(*args) in a newly started interpreter: EnvPool forks its workers, which moolib refuses
    in a process that has threads already, and each measurement starts from a clean process."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def in_thread(fn, *args):
    """fn(*args) in a second thread, where the experiment runs its learner: there it runs a few
    percent faster than in a process's main thread (measured: 150 against 141 SPS on Pong)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


def measure_env_limit(env_name, settings, warmup, seconds):
    """Env steps per second of EnvPool alone, stepped like the agent steps it."""
    B, num_batches = settings["actor_batch_size"], settings["num_actor_batches"]
    factory = env_factory(env_name, experiment_flags(settings), seed=12345)
    num_actions = factory.spaces()[1].n
    envs = moolib.EnvPool(
        factory, num_processes=settings["num_actor_cpus"], batch_size=B, num_batches=num_batches
    )
    futures = [envs.step(i, torch.zeros(B, dtype=torch.int64)) for i in range(num_batches)]
    batch = 0

    def step():
        nonlocal batch
        # Copy out of shared memory, as the agent does before the next step overwrites it.
        {key: value.clone() for key, value in futures[batch].result().items()}
        futures[batch] = envs.step(batch, torch.randint(num_actions, (B,)))
        batch = (batch + 1) % num_batches

    deadline = time.monotonic() + warmup
    while time.monotonic() < deadline:
        step()
    steps, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        step()
        steps += B
    elapsed = time.monotonic() - start
    for future in futures:  # let the workers finish before the pool goes away with this frame
        with contextlib.suppress(Exception):
            future.result()
    return {"env_limit_sps": steps / elapsed, "env_limit_seconds": round(elapsed, 1)}


def random_observations(observation_space, shape):
    if observation_space.dtype == np.uint8:
        return torch.randint(0, 256, shape + observation_space.shape, dtype=torch.uint8)
    if observation_space.dtype == np.bool_:
        return torch.rand(shape + observation_space.shape) < 0.2
    return torch.randn(shape + observation_space.shape)


def random_learner_batch(observation_space, num_actions, T, B):
    """A [T+1, B] batch with the dtypes and shapes the agent's Batcher hands the learner."""
    shape = (T + 1, B)
    return {
        "state": random_observations(observation_space, shape),
        "done": torch.rand(shape) < 0.01,
        "reward": torch.randint(-1, 2, shape).float(),
        "action": torch.randint(num_actions, shape),
        "policy_logits": torch.randn(shape + (num_actions,)),
    }


def build_model(flags, observation_space, num_actions, before=False, device="cpu"):
    """The experiment's model; `before`: as earlier versions ran it (fp32, NCHW activations)."""
    precision = "fp32" if before else flags.precision
    model = create_model(
        observation_space, num_actions, precision=precision, device=device, **architecture(flags)
    )
    if before and hasattr(model, "memory_format"):
        model.memory_format = torch.contiguous_format
    return model.to(device)


class AloneInGroup:
    """What step_optimizer asks of the Accumulator, for a peer alone in its group: its own
    gradients are the reduced ones."""

    def __init__(self, model, batch_size):
        self.model, self.batch_size = model, batch_size

    def get_gradient_stats(self):
        return {"batch_size": self.batch_size}

    def zero_gradients(self):
        self.model.zero_grad(set_to_none=False)


class MatmulBench:
    """A 2048x2048 matrix product, counted in GFLOP: the machine's arithmetic peak."""

    def __init__(self, dtype):
        self.a = torch.randn(MATMUL_SIZE, MATMUL_SIZE).to(dtype)
        self.b = torch.randn(MATMUL_SIZE, MATMUL_SIZE).to(dtype)
        self.samples = 2 * MATMUL_SIZE**3 / 1e9

    def step(self):
        self.a @ self.b


class LearnerBench:
    """One learner step of the experiment, on one model and a fixed random batch."""

    def __init__(self, flags, observation_space, num_actions, before=False, device="cpu"):
        self.flags = flags
        self.model = build_model(flags, observation_space, num_actions, before, device)
        self.state = LearnerState(self.model, create_optimizer(flags, self.model))
        # One optimizer step learns from one minibatch (the whole batch without minibatches).
        T, B = flags.unroll_length, flags.batch_size // flags.learner_minibatches
        self.group = AloneInGroup(self.model, B)
        self.samples = T * B
        batch = random_learner_batch(observation_space, num_actions, T, B)
        batch = {key: value.to(device) for key, value in batch.items()}
        self.batch = frames_for_encode(self.model, batch)  # as the learner stores them
        if flags.use_lstm:
            self.batch["core_state"] = self.model.initial_state(B)

    def step(self):
        """The learner thread's gradients(), then the main thread's optimizer step on them, as a
        peer alone in its group takes it."""
        grads, _ = gradients(self.flags, self.model, self.batch)
        for param, grad in zip(self.model.parameters(), grads, strict=True):
            param.grad = grad
        step_optimizer(self.flags, self.state, self.group)

    def gflop_per_sample(self):
        """Forward and backward of one step by torch's own count of the matrix products and
        convolutions (the elementwise work is left out), per sample of T x B."""
        with FlopCounterMode(display=False) as counter:
            gradients(self.flags, self.model, self.batch)
        return counter.get_total_flops() / self.samples / 1e9


class ActingBench:
    """The acting model's forward and action sampling on one actor batch, as the actor runs it."""

    def __init__(self, flags, observation_space, num_actions, before=False):
        self.model = build_model(flags, observation_space, num_actions, before)
        B = flags.actor_batch_size
        self.samples = B
        self.inputs = {
            "state": random_observations(observation_space, (1, B)),
            "done": torch.zeros(1, B, dtype=torch.bool),
        }
        self.core_state = self.model.initial_state(B)

    def step(self):
        with torch.no_grad():
            outputs, _ = self.model(self.inputs, self.core_state)
            logits = outputs["policy_logits"][0]
            torch.multinomial(torch.softmax(logits, dim=-1), 1)


def alternate(benches, warmup_steps, seconds, rounds=4):
    """Samples per second of each bench, run in `rounds` alternating slices of seconds/rounds
    each (at least 2 steps a slice)."""
    for bench in benches.values():
        for _ in range(warmup_steps):
            bench.step()
    totals = {name: [0, 0.0] for name in benches}
    for _ in range(rounds):
        for name, bench in benches.items():
            steps, start = 0, time.perf_counter()
            while steps < 2 or time.perf_counter() - start < seconds / rounds:
                bench.step()
                steps += 1
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # a GPU's steps are only queued until here
            totals[name][0] += steps * bench.samples
            totals[name][1] += time.perf_counter() - start
    return {name: samples / elapsed for name, (samples, elapsed) in totals.items()}


def measure_learner_limit(env_name, settings, warmup_steps, seconds):
    """Samples (T x B) per second of the experiment's learner step, now and as before, with no
    envs and no moolib; the GFLOP per sample and GFLOP/s; the machine's matmul peak with the
    same number of threads; and the acting model's samples per second."""
    flags = experiment_flags(settings)
    if flags.torch_threads > 0:
        torch.set_num_threads(flags.torch_threads)
    observation_space, action_space = env_factory(env_name, flags).spaces()
    num_actions = action_space.n
    benches = {
        "now": LearnerBench(flags, observation_space, num_actions),
        "before": LearnerBench(flags, observation_space, num_actions, before=True),
    }
    gflop = benches["before"].gflop_per_sample()
    # The machine's peak in the same alternating rounds: on a shared machine a peak measured
    # apart from the learner can come out below what the learner then reaches.
    benches["matmul_fp32"] = MatmulBench(torch.float32)
    if bf16_supported("cpu"):
        benches["matmul_bf16"] = MatmulBench(torch.bfloat16)
    rates = in_thread(alternate, benches, warmup_steps, seconds)
    use_acting_threads(flags)  # as the agent's main thread acts
    acting = {
        "now": ActingBench(flags, observation_space, num_actions),
        "before": ActingBench(flags, observation_space, num_actions, before=True),
    }
    acting_rates = alternate(acting, 3, seconds / 2)
    # Every env step is learned from learner_passes times: the learner limits the agent to
    # its samples per second over that many env steps per second.
    passes = flags.learner_passes
    return {
        "learner_limit_sps": rates["now"] / passes,
        "learner_limit_before_sps": rates["before"] / passes,
        "learner_samples_per_s": rates["now"],
        "learner_passes": passes,
        "learner_gflop_per_sample": gflop,
        "learner_gflops": rates["now"] * gflop,
        "learner_before_gflops": rates["before"] * gflop,
        "acting_sps": acting_rates["now"],
        "acting_before_sps": acting_rates["before"],
        "precision": acting["now"].model.precision,
        "peak_fp32_gflops": rates["matmul_fp32"],
        "peak_bf16_gflops": rates.get("matmul_bf16"),
    }


def measure_limits(env_name, settings, mode):
    env = in_fresh_process(
        measure_env_limit, env_name, settings, mode["env_warmup"], mode["env_seconds"]
    )
    learner = in_fresh_process(
        measure_learner_limit,
        env_name,
        settings,
        mode["learner_warmup_steps"],
        mode["learner_seconds"],
    )
    return {**env, **learner}


def measure_gpu_learner(env_name, settings, seconds, device):
    """Learner samples/s on a GPU with fp32 and with bf16, and the GPU's matmul peak: the
    measurements that choose the default precision for CUDA."""
    flags = experiment_flags(settings)
    observation_space, action_space = env_factory(env_name, flags).spaces()
    benches = {}
    for precision in PRECISIONS:
        flags.precision = precision
        benches[precision] = LearnerBench(
            flags, observation_space, action_space.n, device=torch.device(device)
        )
    gflop = benches["fp32"].gflop_per_sample()
    rates = alternate(benches, 3, seconds)
    peak = measure_peak(2, device=device)
    result = {f"learner_{p}_sps": rate for p, rate in rates.items()}
    result.update(learner_gflop_per_sample=gflop, **peak)
    return result
