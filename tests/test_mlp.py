"""runtime/mlp.py: the acting pass in one compiled call equals the PPO pair's torch modules, and says where it
does not run."""

import types
import warnings

import numpy as np
import pytest
import torch

from runtime import fast_acting
from runtime.opponents import script_module


def policy(algo, discrete=True, **flags):
    module = script_module(algo)
    spec = types.SimpleNamespace(name="agent", n_agents=3, obs_shape=(2, 3), action_dim=4, discrete=discrete,
                                 has_action_mask=False)  # fmt: skip
    args = module.Args(hidden_size=16, **flags)
    torch.manual_seed(0)
    pol = module.Policy(spec, 7, args) if algo == "mappo" else module.Policy(spec, args)
    for p in pol.parameters():  # biases away from their zero initialization, so the test sees them
        p.data += 0.1 * torch.randn_like(p)
    rng = np.random.default_rng(0)
    pol.update_input_norms({"obs": rng.normal(2.0, 3.0, (50, 3, 6)), "agent_mask": np.ones((50, 3), bool),
                            "state": rng.normal(-1.0, 0.5, (50, 7))})  # fmt: skip
    return pol


@pytest.mark.parametrize("algo", ["mappo", "ippo"])
@pytest.mark.parametrize("flags", [{}, {"share_params": False}, {"feature_norm": "none"}], ids=str)
@pytest.mark.parametrize("discrete", [True, False], ids=["discrete", "continuous"])
def test_the_compiled_acting_pass_equals_the_modules(algo, flags, discrete):
    pol = policy(algo, discrete, **flags)
    obs = torch.as_tensor(np.random.default_rng(1).normal(2.0, 20.0, (5, 3, 2, 3)), dtype=torch.float32)
    critic_in = torch.randn(5, 7) * 3 if algo == "mappo" else obs
    want = pol.actor_out(obs)[0], pol.critic_values(critic_in)[0]  # autograd on: the modules
    with torch.inference_mode():
        assert fast_acting(obs, pol.actor) and fast_acting(critic_in, pol.critic)  # the compiled pass runs
        got = pol.actor_out(obs)[0], pol.critic_values(critic_in)[0]
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("flags", [{"rnn": True}, {"feature_norm": "layer"}], ids=str)
def test_networks_with_a_gru_or_layernorm_keep_the_modules(flags):
    pol = policy("ippo", **flags)
    with torch.inference_mode():
        assert not fast_acting(torch.zeros(2, 3, 6), pol.actor)


def test_autograd_keeps_the_modules_and_another_dtype_says_so():
    pol = policy("ippo")
    assert not fast_acting(torch.zeros(2, 3, 6), pol.actor)  # the update: gradients needed
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not fast_acting(torch.zeros(2, 3, 6, dtype=torch.float64), pol.actor)
    assert [str(w.message) for w in caught] == ["acting: torch.float64 tensors on cpu run the torch modules"]


def test_the_pass_follows_the_weights_when_they_change_in_place_or_move():
    pol, obs = policy("ippo"), torch.randn(4, 3, 2, 3)
    for change in (lambda: None, lambda: [p.add_(0.3) for p in pol.parameters()],  # an optimizer's step
                   lambda: pol.double().float(),  # new storage, as a move between devices
                   lambda: [p.mul_(-1.5) for p in pol.parameters()]):  # fmt: skip
        with torch.no_grad():
            change()
            want = pol.actor(pol.inputs(obs))[0]
            assert fast_acting(obs, pol.actor)
            torch.testing.assert_close(pol.actor_out(obs)[0], want, rtol=1e-5, atol=1e-5)
