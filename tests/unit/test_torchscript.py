"""The learner's loss in TorchScript (examples/common/torchscript.py): compiled where torch has
TorchScript, the same numbers to the last bit as the same functions run by Python, and plain
functions where torch has no TorchScript."""

import os
import subprocess
import sys
from pathlib import Path

import torch

from examples.common import torchscript, vtrace
from examples.vtrace import loss

REPOSITORY = Path(__file__).resolve().parents[2]

# Gradients and loss terms of compute_loss on a seeded batch with time-limit cuts and episode
# ends, for V-trace's policy gradient and for the clipped surrogate with normalized advantages
# (where a ratio of exactly 1 meets torch.min's tie); saved to argv[1].
GRADIENTS = """
import sys, torch
from types import SimpleNamespace
from examples.vtrace.loss import compute_loss
T, B, A = 6, 5, 4
torch.manual_seed(0)
model = torch.nn.Linear(3, A + 1)
def net(inputs, core_state):
    out = model(inputs["state"])
    return {"policy_logits": out[..., :A], "baseline": out[..., A]}, ()
batch = {"state": torch.randn(T + 1, B, 3), "done": torch.rand(T + 1, B) < 0.2,
         "truncated": torch.rand(T + 1, B) < 0.1, "reward": torch.randn(T + 1, B),
         "action": torch.randint(A, (T + 1, B))}
with torch.no_grad():
    batch["policy_logits"] = net(batch, ())[0]["policy_logits"]
batch["policy_logits"][: T // 2] += torch.randn(T // 2, B, A)
results = []
for pg_clip, normalize in [(0.0, False), (0.2, True)]:
    flags = SimpleNamespace(reward_clip=1.0, discounting=0.99, normalize_advantages=normalize,
                            pg_clip=pg_clip, baseline_cost=0.5, entropy_cost=0.01,
                            vtrace_lambda=0.95)
    total, stats = compute_loss(flags, net, batch)
    results.append((torch.autograd.grad(total, list(model.parameters())), stats))
torch.save(results, sys.argv[1])
"""


def test_the_learner_loss_is_compiled():
    assert isinstance(loss.actor_critic_loss, torch.jit.ScriptFunction)
    assert isinstance(loss.output_gradients, torch.jit.ScriptFunction)
    assert isinstance(vtrace.from_importance_weights, torch.jit.ScriptFunction)


def test_compiled_and_python_give_the_same_numbers(tmp_path):
    for jit in ("1", "0"):  # PYTORCH_JIT=0: torch.jit.script returns the Python function
        subprocess.run([sys.executable, "-c", GRADIENTS, str(tmp_path / jit)],
                       env={**os.environ, "PYTORCH_JIT": jit}, cwd=REPOSITORY, check=True,
                       timeout=120)  # fmt: skip
    compiled, python = (torch.load(tmp_path / jit) for jit in ("1", "0"))
    for (compiled_grads, compiled_stats), (grads, stats) in zip(compiled, python, strict=True):
        assert compiled_stats.keys() == stats.keys()
        torch.testing.assert_close(  # NaN: the clip fraction without pg_clip
            torch.tensor([*compiled_stats.values()]), torch.tensor([*stats.values()]),
            rtol=0, atol=0, equal_nan=True,
        )  # fmt: skip
        for a, b in zip(compiled_grads, grads, strict=True):
            assert torch.equal(a, b)


def test_without_torchscript_the_function_itself_is_used(monkeypatch):
    monkeypatch.delattr(torch.jit, "script")

    def add_one(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    assert torchscript.compiled(add_one) is add_one
