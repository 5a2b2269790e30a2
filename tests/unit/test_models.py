"""Tests for the V-trace networks: shapes, dtypes, model choice, LSTM resets, init, gradients."""

import re

import gymnasium as gym
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from examples.vtrace.config import ConfigError, ExperimentConfig, check_flags
from examples.vtrace.models import (
    AtariNet,
    HalfNatureNet,
    MinAtarNet,
    MLPNet,
    NatureNet,
    architecture,
    create_model,
    frames_for_encode,
)

NUM_ACTIONS = 6

# (class, observation shape, dtype the environment hands out)
NETS = {
    "atari": (AtariNet, (4, 84, 84), torch.uint8),
    "nature": (NatureNet, (4, 84, 84), torch.uint8),
    "nature_half": (HalfNatureNet, (4, 84, 84), torch.uint8),
    "minatar": (MinAtarNet, (10, 10, 4), torch.bool),
    "mlp": (MLPNet, (4,), torch.float64),
}


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def random_obs(kind: str, T: int, B: int) -> torch.Tensor:
    _, shape, dtype = NETS[kind]
    if dtype == torch.uint8:
        return torch.randint(0, 256, (T, B, *shape), dtype=torch.uint8)
    if dtype == torch.bool:
        return torch.rand(T, B, *shape) < 0.2
    return torch.randn(T, B, *shape, dtype=dtype)


def make(kind: str, use_lstm: bool):
    cls, shape, _ = NETS[kind]
    return cls(shape, NUM_ACTIONS, use_lstm=use_lstm)


def run(model, obs, done, core_state):
    return model({"state": obs, "done": done}, core_state)


def warm_state(model, kind: str, B: int) -> tuple:
    # A non-zero starting state, so that both resets and carried-over state matter.
    with torch.no_grad():
        _, state = run(
            model,
            random_obs(kind, 3, B),
            torch.zeros(3, B, dtype=torch.bool),
            model.initial_state(B),
        )
    return state


@pytest.mark.parametrize("use_lstm", [False, True], ids=["ff", "lstm"])
@pytest.mark.parametrize("kind", NETS)
@pytest.mark.parametrize("T, B", [(3, 2), (1, 5)])
def test_output_shapes_and_dtypes(kind, use_lstm, T, B):
    model = make(kind, use_lstm)
    obs = random_obs(kind, T, B)
    assert obs.dtype == NETS[kind][2]
    state = model.initial_state(B)
    outputs, new_state = run(model, obs, torch.zeros(T, B, dtype=torch.bool), state)

    assert outputs["policy_logits"].shape == (T, B, NUM_ACTIONS)
    assert outputs["baseline"].shape == (T, B)
    assert outputs["policy_logits"].dtype == torch.float32
    assert outputs["baseline"].dtype == torch.float32
    if use_lstm:
        assert len(state) == 2
        for s, new in zip(state, new_state, strict=True):
            assert s.shape == new.shape == (1, B, model.hidden_size)
            assert torch.count_nonzero(s) == 0
    else:
        assert state == () and new_state == ()


def test_feedforward_ignores_missing_done():
    model = make("mlp", use_lstm=False)
    outputs, _ = model({"state": random_obs("mlp", 2, 3)}, ())
    assert outputs["baseline"].shape == (2, 3)


def box(shape, dtype):
    return gym.spaces.Box(low=0, high=1, shape=shape, dtype=dtype)


@pytest.mark.parametrize(
    "shape, dtype, cls",
    [
        ((4,), np.float32, MLPNet),
        ((6,), np.float32, MLPNet),
        ((4, 84, 84), np.uint8, AtariNet),
        ((10, 10, 4), np.bool_, MinAtarNet),
    ],
)
def test_create_model_picks_net(shape, dtype, cls):
    model = create_model(box(shape, dtype), NUM_ACTIONS, use_lstm=True)
    assert type(model) is cls
    assert model.use_lstm
    assert type(create_model(box(shape, dtype), NUM_ACTIONS)) is cls


def test_atari_net_picks_the_atari_torso():
    atari = box((4, 84, 84), np.uint8)
    assert type(create_model(atari, NUM_ACTIONS, atari_net="nature")) is NatureNet
    assert type(create_model(atari, NUM_ACTIONS, atari_net="resnet")) is AtariNet
    assert type(create_model(atari, NUM_ACTIONS, atari_net="nature_half")) is HalfNatureNet
    # Only Atari frames have a choice: MinAtar keeps its net whatever atari_net says.
    minatar = box((10, 10, 4), np.bool_)
    assert type(create_model(minatar, NUM_ACTIONS, atari_net="nature")) is MinAtarNet
    with pytest.raises(ValueError, match="atari_net must be one of resnet, nature"):
        create_model(atari, NUM_ACTIONS, atari_net="dqn")


@pytest.mark.parametrize(
    "net,channels,hidden", [(NatureNet, (32, 64, 64), 512), (HalfNatureNet, (16, 32, 32), 256)]
)
def test_nature_nets_have_the_nature_dqn_layers(net, channels, hidden):
    model = net((4, 84, 84), NUM_ACTIONS)
    convs = [m for m in model.convs if isinstance(m, torch.nn.Conv2d)]
    shapes = [(c.out_channels, c.kernel_size[0], c.stride[0]) for c in convs]
    assert shapes == [(channels[0], 8, 4), (channels[1], 4, 2), (channels[2], 3, 1)]
    assert model.fc.in_features == channels[2] * 7 * 7 and model.fc.out_features == hidden


@pytest.mark.parametrize("atari_net", ["nature_half", "nature", "resnet"])
def test_center_frames_is_the_net_on_each_frame_minus_its_mean(atari_net):
    atari = box((4, 84, 84), np.uint8)
    torch.manual_seed(0)
    centered = create_model(atari, NUM_ACTIONS, atari_net=atari_net, center_frames=True)
    plain = create_model(atari, NUM_ACTIONS, atari_net=atari_net)
    plain.load_state_dict(centered.state_dict())  # the same weights: checkpoints fit both
    frames = torch.randint(0, 200, (2, 3, 4, 84, 84), dtype=torch.uint8)
    done = torch.zeros(2, 3, dtype=torch.bool)
    out, _ = centered({"state": frames, "done": done})
    as_float = frames.float()
    by_hand = as_float - as_float.mean(dim=(3, 4), keepdim=True)
    expected, _ = plain({"state": by_hand, "done": done})
    torch.testing.assert_close(out["policy_logits"], expected["policy_logits"])
    torch.testing.assert_close(out["baseline"], expected["baseline"])
    # A brighter background changes nothing; without centring it does.
    brighter, _ = centered({"state": frames + 50, "done": done})
    torch.testing.assert_close(brighter["baseline"], out["baseline"], atol=1e-4, rtol=1e-4)
    plain_out, _ = plain({"state": frames, "done": done})
    plain_brighter, _ = plain({"state": frames + 50, "done": done})
    assert not torch.allclose(plain_brighter["baseline"], plain_out["baseline"], atol=1e-4)


def court_frames(background, seed=0):
    """Atari-like frames [1, 3, 4, 84, 84]: one grey level on 90% of the pixels, bright and dark
    objects on the rest."""
    generator = torch.Generator().manual_seed(seed)
    frames = torch.full((1, 3, 4, 84, 84), background, dtype=torch.uint8)
    objects = torch.rand(frames.shape, generator=generator) < 0.1
    levels = torch.randint(0, 256, frames.shape, generator=generator, dtype=torch.uint8)
    return torch.where(objects, levels, frames)


@pytest.mark.parametrize("atari_net", ["nature_half", "resnet"])
def test_center_frames_on_background_subtracts_each_frames_commonest_level(atari_net):
    atari = box((4, 84, 84), np.uint8)
    torch.manual_seed(0)
    centered = create_model(
        atari, NUM_ACTIONS, atari_net=atari_net, center_frames=True, center_frames_on="background"
    )
    plain = create_model(atari, NUM_ACTIONS, atari_net=atari_net)
    plain.load_state_dict(centered.state_dict())
    frames = court_frames(87)
    frames[0, 1] = court_frames(142, seed=1)[0, 1]  # another step, another background
    done = torch.zeros(1, 3, dtype=torch.bool)
    out, _ = centered({"state": frames, "done": done})
    background = torch.tensor([87.0, 142.0, 87.0])[None, :, None, None, None]
    expected, _ = plain({"state": frames.float() - background, "done": done})
    torch.testing.assert_close(out["baseline"], expected["baseline"], atol=1e-4, rtol=1e-4)
    # On a black background (Breakout's) it is the net without centring, where "mean" is not.
    black = court_frames(0)
    on_black, _ = centered({"state": black, "done": done})
    uncentered, _ = plain({"state": black, "done": done})
    torch.testing.assert_close(on_black["baseline"], uncentered["baseline"])
    torch.manual_seed(0)
    on_mean = create_model(atari, NUM_ACTIONS, atari_net=atari_net, center_frames=True)
    mean_out, _ = on_mean({"state": black, "done": done})
    assert not torch.allclose(mean_out["baseline"], uncentered["baseline"], atol=1e-4)


def test_center_frames_on_takes_only_its_two_values():
    atari = box((4, 84, 84), np.uint8)
    with pytest.raises(ValueError, match="center_frames_on must be one of mean, background"):
        create_model(atari, NUM_ACTIONS, atari_net="nature_half", center_frames_on="median")


def test_center_frames_leaves_other_nets_alone():
    minatar = box((10, 10, 4), np.bool_)
    assert type(create_model(minatar, NUM_ACTIONS, center_frames=True)) is MinAtarNet
    cartpole = box((4,), np.float32)
    assert type(create_model(cartpole, NUM_ACTIONS, center_frames=True)) is MLPNet


def test_centered_first_layer_has_no_silent_channels_on_a_uniform_background():
    # A fresh net's first layer on a frame of one grey with a few bright dots (Pong's court and
    # ball): without centring, channels whose weights sum below zero never fire.
    atari = box((4, 84, 84), np.uint8)
    frames = torch.full((1, 16, 4, 84, 84), 87, dtype=torch.uint8)
    for i in range(16):
        frames[0, i, :, 4 + 5 * i : 6 + 5 * i, 10 + 4 * i : 12 + 4 * i] = 236
    silent = {}
    for center in (False, True):
        torch.manual_seed(1)
        net = create_model(atari, NUM_ACTIONS, atari_net="nature_half", center_frames=center)
        first_layer = []  # the first ReLU's output: convs[1] is the ReLU after the first conv
        net.convs[1].register_forward_hook(
            lambda module, i, out, seen=first_layer: seen.append(out)
        )
        net({"state": frames, "done": torch.zeros(1, 16, dtype=torch.bool)})
        fired = (first_layer[0] > 0).flatten(2).any(2).any(0)
        silent[center] = int((~fired).sum())
    assert silent[True] == 0
    assert silent[False] > 0


def breakout_like_frames(count=64):
    """MinAtar frames [N, 10, 10, 4] that share most of their cells, as a wall of bricks makes
    Breakout's: a ball and a paddle move, the rest stays."""
    frames = torch.zeros(count, 10, 10, 4)
    frames[:, 1:4, :, 3] = 1
    for i in range(count):
        frames[i, 5 + i % 5, i % 10, 0] = frames[i, 9, (3 * i) % 10, 1] = 1
    return frames


def hidden_before_relu_and_grads(layer_norm):
    """The MinAtar net's hidden layer before its ReLU on breakout_like_frames, and the fc
    layer's weight gradients of a loss on the value head."""
    torch.manual_seed(0)
    net = create_model(box((10, 10, 4), np.bool_), NUM_ACTIONS, layer_norm=layer_norm)
    seen = []
    net.norm.register_forward_hook(lambda module, i, out: seen.append(out))
    frames = breakout_like_frames()
    out, _ = net({"state": frames[None], "done": torch.zeros(1, len(frames), dtype=torch.bool)})
    out["baseline"].square().sum().backward()
    return seen[0].detach(), net.fc.weight.grad


def test_layer_norm_normalises_each_frames_hidden_sums():
    hidden, _ = hidden_before_relu_and_grads(layer_norm=True)
    torch.testing.assert_close(hidden.mean(1), torch.zeros(len(hidden)), atol=1e-5, rtol=0)
    std = hidden.std(1, unbiased=False)
    torch.testing.assert_close(std, torch.ones(len(hidden)), atol=1e-2, rtol=0)


@pytest.mark.parametrize("layer_norm", [False, True])
def test_layer_norm_lets_units_silent_on_every_frame_learn(layer_norm):
    # A unit below zero on every frame gets no gradient through its own ReLU; behind the layer
    # norm it still does, through the layer's mean and spread that the other units' sums share.
    hidden, grads = hidden_before_relu_and_grads(layer_norm)
    silent = (hidden <= 0).all(0)
    assert silent.sum() > 0  # frames this alike leave some units silent either way
    learning = grads[silent].abs().sum(1) > 0
    assert bool(learning.all()) if layer_norm else not bool(learning.any())


def test_layer_norm_off_keeps_the_minatar_nets_weights_as_before():
    minatar = box((10, 10, 4), np.bool_)
    plain = create_model(minatar, NUM_ACTIONS)
    # Checkpoints from before the key load as they did: no new weights without it.
    assert not any(key.startswith("norm.") for key in plain.state_dict())
    normed = create_model(minatar, NUM_ACTIONS, layer_norm=True)
    assert {key for key in normed.state_dict() if key.startswith("norm.")} == {
        "norm.weight",
        "norm.bias",
    }


def test_layer_norm_leaves_other_nets_alone():
    atari = box((4, 84, 84), np.uint8)
    plain = create_model(atari, NUM_ACTIONS, atari_net="nature_half")
    normed = create_model(atari, NUM_ACTIONS, atari_net="nature_half", layer_norm=True)
    assert normed.state_dict().keys() == plain.state_dict().keys()
    cartpole = box((4,), np.float32)
    assert type(create_model(cartpole, NUM_ACTIONS, layer_norm=True)) is MLPNet


def test_architecture_keys_are_experiment_settings():
    flags = ExperimentConfig(layer_norm=True, atari_net="nature")
    assert architecture(flags) == {
        "use_lstm": False,
        "atari_net": "nature",
        "center_frames": False,
        "center_frames_on": "mean",
        "layer_norm": True,
        "minatar_hidden": 128,
    }
    assert architecture(OmegaConf.structured(flags)) == architecture(flags)


def test_minatar_hidden_widens_the_hidden_layer_and_both_heads():
    minatar = box((10, 10, 4), np.bool_)
    plain, wide = (create_model(minatar, NUM_ACTIONS, minatar_hidden=n) for n in (128, 256))
    assert plain.state_dict().keys() == wide.state_dict().keys()
    assert wide.fc.weight.shape == (256, 16 * 8 * 8)
    assert wide.policy.weight.shape == (NUM_ACTIONS, 256)
    assert wide.baseline.weight.shape == (1, 256)
    assert plain.fc.weight.shape == (128, 16 * 8 * 8)  # the MinAtar paper's, as before
    out, _ = wide({"state": torch.zeros(1, 3, 10, 10, 4), "done": torch.zeros(1, 3).bool()})
    assert out["policy_logits"].shape == (1, 3, NUM_ACTIONS)


def test_minatar_hidden_leaves_other_nets_alone():
    atari = box((4, 84, 84), np.uint8)
    plain = create_model(atari, NUM_ACTIONS, atari_net="nature_half")
    wide = create_model(atari, NUM_ACTIONS, atari_net="nature_half", minatar_hidden=256)
    assert {k: v.shape for k, v in wide.state_dict().items()} == {
        k: v.shape for k, v in plain.state_dict().items()
    }


@pytest.mark.parametrize("shape", [(3, 3, 3, 3), (84, 84, 4), (2, 2)])
def test_create_model_rejects_unknown_shape(shape):
    with pytest.raises(ValueError, match=re.escape(str(shape))):
        create_model(box(shape, np.float32), NUM_ACTIONS)


@pytest.mark.parametrize("with_reset", [False, True], ids=["no_reset", "reset"])
@pytest.mark.parametrize("kind", NETS)
def test_lstm_sequence_equals_step_by_step(kind, with_reset):
    model = make(kind, use_lstm=True)
    T, B = 4, 2
    obs = random_obs(kind, T, B)
    done = torch.zeros(T, B, dtype=torch.bool)
    if with_reset:
        done[2, 1] = True
    state0 = warm_state(model, kind, B)

    with torch.no_grad():
        full, full_state = run(model, obs, done, state0)
        state, steps = state0, []
        for t in range(T):
            out, state = run(model, obs[t : t + 1], done[t : t + 1], state)
            steps.append(out)

    for key in ("policy_logits", "baseline"):
        stepped = torch.cat([out[key] for out in steps])
        torch.testing.assert_close(full[key], stepped, atol=1e-5, rtol=1e-5)
    for a, b in zip(full_state, state, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", NETS)
def test_lstm_reset_starts_fresh_episode(kind):
    model = make(kind, use_lstm=True)
    T, B = 4, 2
    obs = random_obs(kind, T, B)
    no_done = torch.zeros(T, B, dtype=torch.bool)
    done = no_done.clone()
    done[2, 1] = True
    state0 = warm_state(model, kind, B)

    with torch.no_grad():
        with_reset, _ = run(model, obs, done, state0)
        without_reset, _ = run(model, obs, no_done, state0)
        fresh, _ = run(model, obs[2:], no_done[2:], model.initial_state(B))

    for key in ("policy_logits", "baseline"):
        # Entry 1 before the reset and entry 0 throughout see the same history either way.
        torch.testing.assert_close(with_reset[key][:2], without_reset[key][:2])
        torch.testing.assert_close(with_reset[key][:, 0], without_reset[key][:, 0])
        # From the reset on, entry 1 behaves as if a new sequence began with zero state.
        torch.testing.assert_close(with_reset[key][2:, 1], fresh[key][:, 1], atol=1e-5, rtol=1e-5)
        # ... which really differs from carrying the old state (the test would be vacuous else).
        assert not torch.allclose(with_reset[key][2:, 1], without_reset[key][2:, 1])


def test_lstm_reset_at_first_step_ignores_incoming_state():
    model = make("mlp", use_lstm=True)
    obs = random_obs("mlp", 3, 2)
    done = torch.zeros(3, 2, dtype=torch.bool)
    done[0] = True
    stale = tuple(torch.randn_like(s) for s in model.initial_state(2))
    with torch.no_grad():
        out, _ = run(model, obs, done, stale)
        fresh, _ = run(model, obs, done, model.initial_state(2))
    torch.testing.assert_close(out["policy_logits"], fresh["policy_logits"])


@pytest.mark.parametrize("use_lstm", [False, True], ids=["ff", "lstm"])
@pytest.mark.parametrize("kind", NETS)
def test_initial_policy_is_near_uniform(kind, use_lstm):
    model = make(kind, use_lstm)
    T, B = 3, 4
    with torch.no_grad():
        obs = random_obs(kind, T, B)
        outputs, _ = run(model, obs, torch.zeros(T, B, dtype=torch.bool), model.initial_state(B))
    assert outputs["policy_logits"].abs().max() < 0.05


@pytest.mark.parametrize("use_lstm", [False, True], ids=["ff", "lstm"])
@pytest.mark.parametrize("kind", NETS)
def test_optimizer_step_updates_every_parameter(kind, use_lstm):
    model = make(kind, use_lstm)
    T, B = 3, 2
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}

    outputs, _ = run(
        model, random_obs(kind, T, B), torch.zeros(T, B, dtype=torch.bool), model.initial_state(B)
    )
    # Touch both heads, so every parameter (torso, core, heads) has a path to the loss.
    log_probs = torch.log_softmax(outputs["policy_logits"], dim=-1)
    loss = -log_probs[..., 0].mean() + (outputs["baseline"] - 1.0).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    names = [name for name, _ in model.named_parameters()]
    assert any(n.startswith("core.") for n in names) == use_lstm
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == []


@pytest.mark.parametrize("kind", NETS)
def test_bf16_keeps_float32_weights_grads_and_outputs(kind):
    fp32 = make(kind, use_lstm=True)
    cls, shape, _ = NETS[kind]
    bf16 = cls(shape, NUM_ACTIONS, use_lstm=True, precision="bf16")
    # Same parameters, so that checkpoints and group states load either way.
    assert {k: v.shape for k, v in bf16.state_dict().items()} == {
        k: v.shape for k, v in fp32.state_dict().items()
    }
    bf16.load_state_dict(fp32.state_dict())
    obs, done = random_obs(kind, 3, 4), torch.zeros(3, 4, dtype=torch.bool)
    (out32, _), (out16, _) = (run(m, obs, done, m.initial_state(4)) for m in (fp32, bf16))
    for key in ["policy_logits", "baseline"]:
        assert out16[key].dtype == torch.float32
        # bf16 keeps 8 bits of mantissa: close, not equal.
        assert torch.allclose(out16[key], out32[key], rtol=0.05, atol=0.05)
    out16["baseline"].sum().backward()
    assert all(p.grad.dtype == torch.float32 for p in bf16.parameters() if p.grad is not None)


@pytest.mark.parametrize("kind", ["atari", "nature"])
def test_channels_last_changes_layout_not_results(kind):
    model = make(kind, use_lstm=False)
    obs, done = random_obs(kind, 2, 3), torch.zeros(2, 3, dtype=torch.bool)
    out_nhwc, _ = run(model, obs, done, ())
    model.memory_format = torch.contiguous_format
    out_nchw, _ = run(model, obs, done, ())
    assert torch.allclose(out_nhwc["policy_logits"], out_nchw["policy_logits"], atol=1e-5)
    assert torch.allclose(out_nhwc["baseline"], out_nchw["baseline"], atol=1e-5)
    # The weights keep their layout: the Accumulator and checkpoints see plain tensors.
    assert all(p.is_contiguous() for p in model.parameters())


@pytest.mark.parametrize("kind", ["atari", "nature_half", "minatar", "mlp"])
def test_learner_batches_keep_their_values_in_the_layout_encode_wants(kind):
    model = make(kind, use_lstm=False)
    obs, done = random_obs(kind, 3, 4), torch.zeros(3, 4, dtype=torch.bool)
    batch = frames_for_encode(model, {"state": obs, "done": done})
    assert torch.equal(batch["state"], obs) and batch["done"] is done
    if kind in ("atari", "nature_half"):
        # Stored as [T, B, H, W, C]: merging T and B gives channels-last frames, no copy.
        assert batch["state"].flatten(0, 1).is_contiguous(memory_format=torch.channels_last)
    else:
        assert batch["state"] is obs  # nothing to do for the nets without a memory_format
    out_stored, _ = run(model, batch["state"], done, ())
    out_plain, _ = run(model, obs, done, ())
    assert torch.allclose(out_stored["policy_logits"], out_plain["policy_logits"], atol=1e-5)
    assert torch.allclose(out_stored["baseline"], out_plain["baseline"], atol=1e-5)


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="precision must be one of"):
        create_model(gym.spaces.Box(0, 1, (4,)), NUM_ACTIONS, precision="fp16")


def test_auto_precision_is_bf16_only_where_measured_faster():
    from examples.vtrace.models import bf16_supported

    atari = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    expected = "bf16" if bf16_supported("cpu") else "fp32"
    assert create_model(atari, NUM_ACTIONS, precision="auto").precision == expected
    assert create_model(atari, NUM_ACTIONS, precision="auto", device="cuda:0").precision == "fp32"
    # Not measured on a CPU with AVX512-BF16 but no AMX: the Nature CNN stays fp32.
    nature = create_model(atari, NUM_ACTIONS, precision="auto", atari_net="nature")
    assert nature.precision == "fp32"
    cartpole = gym.spaces.Box(-1, 1, (4,))
    assert create_model(cartpole, NUM_ACTIONS, precision="auto").precision == "fp32"


def test_half_nature_net_has_under_a_third_of_the_parameters():
    model = HalfNatureNet((4, 84, 84), NUM_ACTIONS)
    full = sum(p.numel() for p in NatureNet((4, 84, 84), NUM_ACTIONS).parameters())
    assert sum(p.numel() for p in model.parameters()) < full / 3


@pytest.mark.parametrize("width", [0, -128])
def test_minatar_hidden_must_be_positive(width):
    with pytest.raises(
        ConfigError, match=f"minatar_hidden must be a positive integer, got {width}"
    ):
        check_flags(OmegaConf.structured(ExperimentConfig(minatar_hidden=width)))
