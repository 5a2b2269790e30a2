"""V-trace checked against a direct (O(T^2), float64) transcription of the paper's definition."""

import math

import numpy as np
import pytest
import torch

from examples.common import vtrace

ATOL = 1e-5
RTOL = 1e-5

SHAPES = [(1, 1), (1, 4), (5, 3), (20, 7)]
THRESHOLDS = [(1.0, 1.0), (2.5, 2.5), (None, None), (1.0, 2.5), (2.5, 1.0), (None, 1.0)]


def naive_vtrace(log_rhos, discounts, rewards, values, bootstrap_value, clip_rho, clip_pg_rho):
    """v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t V, written out."""
    log_rhos, discounts, rewards, values, bootstrap_value = (
        np.asarray(x, dtype=np.float64)
        for x in (log_rhos, discounts, rewards, values, bootstrap_value)
    )
    T, B = log_rhos.shape
    rhos = np.exp(log_rhos)
    clipped_rhos = rhos if clip_rho is None else np.minimum(clip_rho, rhos)
    clipped_pg_rhos = rhos if clip_pg_rho is None else np.minimum(clip_pg_rho, rhos)
    cs = np.minimum(1.0, rhos)
    values_ext = np.concatenate([values, bootstrap_value[None]], axis=0)  # V(x_T) = bootstrap

    vs = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            total = values_ext[s, b]
            for t in range(s, T):
                weight = 1.0
                for i in range(s, t):
                    weight *= discounts[i, b] * cs[i, b]
                delta = clipped_rhos[t, b] * (
                    rewards[t, b] + discounts[t, b] * values_ext[t + 1, b] - values_ext[t, b]
                )
                total += weight * delta
            vs[s, b] = total

    vs_ext = np.concatenate([vs, bootstrap_value[None]], axis=0)
    pg_advantages = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            pg_advantages[s, b] = clipped_pg_rhos[s, b] * (
                rewards[s, b] + discounts[s, b] * vs_ext[s + 1, b] - values[s, b]
            )
    return vs, pg_advantages


def make_inputs(T, B, seed, episode_ends=True):
    gen = torch.Generator().manual_seed(seed)
    discounts = torch.full((T, B), 0.9)
    if episode_ends:
        # gamma_t = 0 wherever an episode ended inside the unroll.
        dones = torch.rand(T, B, generator=gen) < 0.25
        discounts = discounts.masked_fill(dones, 0.0)
    return dict(
        # Spread wide enough that rho lands on both sides of every threshold tested.
        log_rhos=torch.randn(T, B, generator=gen) * 1.5,
        discounts=discounts,
        rewards=torch.randn(T, B, generator=gen),
        values=torch.randn(T, B, generator=gen),
        bootstrap_value=torch.randn(B, generator=gen),
    )


def assert_close(actual, expected):
    np.testing.assert_allclose(actual.cpu().numpy(), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("T,B", SHAPES)
@pytest.mark.parametrize("clip_rho,clip_pg_rho", THRESHOLDS)
def test_from_importance_weights_matches_definition(T, B, clip_rho, clip_pg_rho):
    inputs = make_inputs(T, B, seed=T * 100 + B)
    out = vtrace.from_importance_weights(
        **inputs, clip_rho_threshold=clip_rho, clip_pg_rho_threshold=clip_pg_rho
    )
    expected_vs, expected_pg = naive_vtrace(
        **{k: v.numpy() for k, v in inputs.items()}, clip_rho=clip_rho, clip_pg_rho=clip_pg_rho
    )
    assert out._fields == vtrace.VTraceReturns._fields  # TorchScript returns its own namedtuple
    assert out.vs.shape == (T, B) and out.pg_advantages.shape == (T, B)
    assert out.vs.dtype == torch.float32
    assert_close(out.vs, expected_vs)
    assert_close(out.pg_advantages, expected_pg)


def test_inputs_actually_exercise_clipping_and_episode_ends():
    inputs = make_inputs(20, 7, seed=2007)
    rhos = inputs["log_rhos"].exp()
    assert (rhos > 2.5).any() and (rhos < 1.0).any()
    assert (inputs["discounts"] == 0).any()


def test_clipping_changes_the_result():
    # Guards against thresholds being silently ignored.
    inputs = make_inputs(5, 3, seed=1)
    clipped = vtrace.from_importance_weights(**inputs, clip_rho_threshold=1.0)
    unclipped = vtrace.from_importance_weights(**inputs, clip_rho_threshold=None)
    assert not torch.allclose(clipped.vs, unclipped.vs)
    pg_1 = vtrace.from_importance_weights(**inputs, clip_pg_rho_threshold=1.0).pg_advantages
    pg_none = vtrace.from_importance_weights(**inputs, clip_pg_rho_threshold=None).pg_advantages
    assert not torch.allclose(pg_1, pg_none)


@pytest.mark.parametrize("T,B", SHAPES)
def test_on_policy_vs_is_the_bootstrapped_return(T, B):
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(T, B, 4, generator=gen)
    actions = torch.randint(0, 4, (T, B), generator=gen)
    inputs = make_inputs(T, B, seed=8)
    del inputs["log_rhos"]
    out = vtrace.from_logits(logits, logits.clone(), actions, **inputs)

    discounts, rewards = inputs["discounts"].numpy(), inputs["rewards"].numpy()
    returns = np.zeros((T, B))
    next_return = inputs["bootstrap_value"].numpy().astype(np.float64)
    for t in reversed(range(T)):
        next_return = rewards[t] + discounts[t] * next_return
        returns[t] = next_return

    assert_close(out.log_rhos, np.zeros((T, B)))
    assert_close(out.vs, returns)
    # With rho = 1 the advantage is the one-step TD error against the V-trace target.
    vs_next = np.concatenate([returns[1:], inputs["bootstrap_value"].numpy()[None]], axis=0)
    assert_close(out.pg_advantages, rewards + discounts * vs_next - inputs["values"].numpy())


@pytest.mark.parametrize("T,B", [(1, 2), (5, 3)])
def test_from_logits(T, B):
    gen = torch.Generator().manual_seed(11)
    A = 5
    behavior_logits = torch.randn(T, B, A, generator=gen)
    target_logits = torch.randn(T, B, A, generator=gen)
    actions = torch.randint(0, A, (T, B), generator=gen)
    inputs = make_inputs(T, B, seed=12)
    del inputs["log_rhos"]
    out = vtrace.from_logits(
        behavior_logits, target_logits, actions, **inputs, clip_rho_threshold=2.0
    )

    def manual_log_softmax(x):
        x = x.astype(np.float64)
        x = x - x.max(axis=-1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))

    idx = actions.numpy()[..., None]
    target_lp = np.take_along_axis(manual_log_softmax(target_logits.numpy()), idx, -1)[..., 0]
    behavior_lp = np.take_along_axis(manual_log_softmax(behavior_logits.numpy()), idx, -1)[..., 0]
    assert_close(out.target_action_log_probs, target_lp)
    assert_close(out.behavior_action_log_probs, behavior_lp)
    assert_close(out.log_rhos, target_lp - behavior_lp)

    expected = vtrace.from_importance_weights(
        out.log_rhos, **inputs, clip_rho_threshold=2.0, clip_pg_rho_threshold=1.0
    )
    torch.testing.assert_close(out.vs, expected.vs)
    torch.testing.assert_close(out.pg_advantages, expected.pg_advantages)


def test_no_gradient_through_targets():
    T, B, A = 5, 3, 4
    gen = torch.Generator().manual_seed(3)
    behavior_logits = torch.randn(T, B, A, generator=gen)
    target_logits = torch.randn(T, B, A, generator=gen, requires_grad=True)
    actions = torch.randint(0, A, (T, B), generator=gen)
    values = torch.randn(T, B, generator=gen, requires_grad=True)
    bootstrap_value = torch.randn(B, generator=gen, requires_grad=True)
    rewards = torch.randn(T, B, generator=gen, requires_grad=True)
    out = vtrace.from_logits(
        behavior_logits,
        target_logits,
        actions,
        discounts=torch.full((T, B), 0.99),
        rewards=rewards,
        values=values,
        bootstrap_value=bootstrap_value,
    )
    assert not out.vs.requires_grad
    assert not out.pg_advantages.requires_grad
    # The log-probs themselves stay differentiable for callers that want them.
    assert out.target_action_log_probs.requires_grad


def test_policy_gradient_loss_by_hand():
    # One step, two envs, two actions.
    logits = torch.tensor([[[0.0, math.log(3.0)], [1.0, 1.0]]], requires_grad=True)
    actions = torch.tensor([[1, 0]])
    advantages = torch.tensor([[2.0, -1.0]], requires_grad=True)
    # pi = [1/4, 3/4] and [1/2, 1/2].
    expected = -(math.log(0.75) * 2.0 + math.log(0.5) * -1.0)
    loss = vtrace.policy_gradient_loss(logits, actions, advantages)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss.backward()
    assert advantages.grad is None  # advantages are constants
    # d/dlogits of -adv * log pi(a) = -adv * (onehot(a) - pi)
    expected_grad = torch.tensor([[[-2.0 * (0 - 0.25), -2.0 * (1 - 0.75)], [1 - 0.5, 0 - 0.5]]])
    torch.testing.assert_close(logits.grad, expected_grad)


def test_baseline_loss_by_hand():
    advantages = torch.tensor([[1.0, -2.0], [0.5, 0.0]])
    assert vtrace.baseline_loss(advantages).item() == pytest.approx(0.5 * (1 + 4 + 0.25))


def test_entropy_loss_by_hand():
    logits = torch.tensor([[[0.0, math.log(3.0)], [5.0, 5.0]]])
    # sum pi log pi for [1/4, 3/4] and [1/2, 1/2]
    expected = 0.25 * math.log(0.25) + 0.75 * math.log(0.75) + 2 * 0.5 * math.log(0.5)
    assert vtrace.entropy_loss(logits).item() == pytest.approx(expected, abs=1e-6)
    # Uniform policy has the lowest value: -log(A) per step.
    uniform = torch.zeros(3, 2, 4)
    assert vtrace.entropy_loss(uniform).item() == pytest.approx(-6 * math.log(4), abs=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    inputs = make_inputs(20, 7, seed=5)
    cpu = vtrace.from_importance_weights(**inputs)
    gpu = vtrace.from_importance_weights(**{k: v.cuda() for k, v in inputs.items()})
    assert gpu.vs.is_cuda
    torch.testing.assert_close(gpu.vs.cpu(), cpu.vs)
    torch.testing.assert_close(gpu.pg_advantages.cpu(), cpu.pg_advantages)


@pytest.mark.parametrize("lambda_", [0.0, 0.5, 0.95])
def test_lambda_gives_the_lambda_return_on_policy(lambda_):
    """On policy (rho = 1) with lambda, vs is GAE's lambda-return: V + sum of
    (gamma lambda)^k delta_{s+k}, written out here as a double sum."""
    T, B = 6, 3
    inputs = {**make_inputs(T, B, seed=3), "log_rhos": torch.zeros(T, B)}
    out = vtrace.from_importance_weights(**inputs, lambda_=lambda_)
    values, discounts = inputs["values"].double(), inputs["discounts"].double()
    next_values = torch.cat([values[1:], inputs["bootstrap_value"].double()[None]])
    deltas = inputs["rewards"].double() + discounts * next_values - values
    expected = values.clone()
    for s in range(T):
        weight = torch.ones(B, dtype=torch.float64)
        for t in range(s, T):
            expected[s] += weight * deltas[t]
            weight = weight * discounts[t] * lambda_
    torch.testing.assert_close(out.vs.double(), expected, atol=ATOL, rtol=RTOL)
    if lambda_ == 0.0:  # one-step targets: r + gamma V(x')
        one_step = inputs["rewards"].double() + discounts * next_values
        torch.testing.assert_close(out.vs.double(), one_step, atol=ATOL, rtol=RTOL)
