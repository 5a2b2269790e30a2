"""Adam, its learning-rate schedule, and one optimizer step on the group's reduced gradients."""

import math

import torch
from torch import nn

from examples.common.torchscript import compiled


def create_optimizer(flags, model):
    return torch.optim.Adam(
        model.parameters(),
        lr=flags.optimizer.learning_rate,
        betas=(flags.optimizer.beta_1, flags.optimizer.beta_2),
        eps=flags.optimizer.epsilon,
        # One kernel over all parameters instead of about ten per tensor: 2.0 against 14.7 ms per
        # step for the Nature CNN on one CPU core, which matters at 5-10 steps per second.
        fused=True,
    )


def learning_rate(flags, env_train_steps, virtual_batch=None):
    """Linear warm-up over `warmup` steps, then linear decay to 0 at optimizer.decay_steps
    (total_steps when that is null); scaled by the step's `virtual_batch` (unrolls) against
    virtual_batch_size as optimizer.batch_scaling says."""
    decay_steps = flags.optimizer.decay_steps or flags.total_steps
    scale = max(0.0, 1.0 - env_train_steps / decay_steps)
    if flags.warmup > 0:
        scale *= min(1.0, env_train_steps / flags.warmup)
    if virtual_batch is not None and flags.optimizer.batch_scaling != "none":
        # Adam's step is about the rate, however many unrolls went into the gradient: a step
        # of two peers' batches moves the weights as far as one peer's step does, so two
        # peers move half as far per env step. Linear scaling restores one peer's pace.
        ratio = virtual_batch / flags.virtual_batch_size
        scale *= ratio if flags.optimizer.batch_scaling == "linear" else math.sqrt(ratio)
    return flags.optimizer.learning_rate * scale


def step_optimizer(flags, state, accumulator):
    """One optimizer step on the group's reduced gradients; returns numbers for the log.

    Reduced gradients that are not finite (one peer's NaN or inf is everyone's after the sum)
    skip the step instead, as AMP's GradScaler does: every peer sees the same sum, so every peer
    skips alike and the weights stay the same everywhere. The samples still count as trained."""
    virtual_batch = accumulator.get_gradient_stats()["batch_size"]  # unrolls, over all peers
    if state.learned_samples is None:
        state.learned_samples = state.env_train_steps * flags.learner_passes
    state.learned_samples += virtual_batch * flags.unroll_length
    # Every batch is learned from learner_passes times: env steps are the new samples only.
    state.env_train_steps = state.learned_samples // flags.learner_passes
    for param_group in state.optimizer.param_groups:
        param_group["lr"] = learning_rate(flags, state.env_train_steps, virtual_batch)
    grad_norm = clip_and_step(state.optimizer, flags.grad_norm_clipping)
    if not math.isfinite(grad_norm):
        state.skipped_steps += 1
    accumulator.zero_gradients()
    return {"grad_norm": grad_norm, "virtual_batch_size": virtual_batch}


def clip_and_step(optimizer, max_norm):
    """clip_grad_norm_ over the optimizer's parameters, then its step if their norm (returned)
    is finite. A fused Adam with its state made (from its first step on, or a checkpoint) steps
    in one compiled call, to the same bits on a CPU: clip_grad_norm_ and Adam.step took 0.77 ms
    of the main thread per MinAtar step, the call 0.55, 62,500 times a run."""
    group = optimizer.param_groups[0]
    params = group["params"]
    states = [optimizer.state.get(param) for param in params]
    for param, state in zip(params, states, strict=True):
        _into_parameter_layout(param, state)
    plain_adam = not (group["amsgrad"] or group["maximize"] or group["weight_decay"])
    every_one = all(states) and all(param.grad is not None for param in params)
    if len(optimizer.param_groups) == 1 and group["fused"] and plain_adam and every_one:
        beta_1, beta_2 = group["betas"]
        tensors = [
            _contiguous_orientation(param, param.grad, state["exp_avg"], state["exp_avg_sq"])
            for param, state in zip(params, states, strict=True)
        ]
        return _clipped_fused_adam(
            *map(list, zip(*tensors, strict=True)), [state["step"] for state in states],
            float(group["lr"]), beta_1, beta_2, group["eps"], float(max_norm),
        )  # fmt: skip
    grad_norm = float(nn.utils.clip_grad_norm_(params, max_norm))
    if math.isfinite(grad_norm):
        optimizer.step()
    return grad_norm


def _into_parameter_layout(param, state):
    """The parameter's gradient and Adam's moments laid out in memory as the parameter is.

    A fused Adam kernel pairs the tensors' elements by their place in memory, not by index: a
    moment in another layout (from a checkpoint of the MinAtar net before its hidden weight was
    stored transposed) or a gradient assigned in another layout would be paired with other
    elements. Autograd and moolib's Accumulator give gradients their parameter's layout, so in
    training this copies nothing, or a checkpoint's moments once."""
    if param.grad is not None and param.grad.stride() != param.stride():
        param.grad = torch.empty_like(param).copy_(param.grad)
    for key in ("exp_avg", "exp_avg_sq"):
        if state and key in state and state[key].stride() != param.stride():
            state[key] = torch.empty_like(param).copy_(state[key])


def _contiguous_orientation(*tensors):
    """Tensors of one layout, transposed where that makes them contiguous (2-D ones stored
    transposed, as the MinAtar net's hidden weight is). Adam's step is the same on every element
    either way, but the fused kernel copies a non-contiguous gradient (a copy it does not use):
    for a 256 x 1024 weight, 0.2 ms of the main thread a step."""
    first = tensors[0]
    if first.dim() == 2 and not first.is_contiguous() and first.t().is_contiguous():
        return tuple(tensor.t() for tensor in tensors)
    return tensors


@compiled
def _clipped_fused_adam(
    params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor], steps: list[torch.Tensor], lr: float, beta_1: float,
    beta_2: float, eps: float, max_norm: float,
) -> float:  # fmt: skip
    # clip_grad_norm_'s ops, then those of Adam.step(fused=True) without its Python around them.
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    grad_norm = float(total)
    if math.isfinite(grad_norm):
        torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
        torch._foreach_add_(steps, 1)
        torch._fused_adam_(
            params, grads, exp_avgs, exp_avg_sqs, [], steps, lr=lr, beta1=beta_1, beta2=beta_2,
            weight_decay=0.0, eps=eps, amsgrad=False, maximize=False,
        )  # fmt: skip
    return grad_norm
