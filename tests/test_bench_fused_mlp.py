"""bench/bench_fused_mlp.py: its hand-written PPO step computes autograd's gradients, so its timings are of the
same work (the prototype of issue 22's option 2)."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_fused_mlp as fused  # noqa: E402


def test_the_hand_written_step_and_the_numba_networks_give_autograds_gradients():
    rng = np.random.default_rng(3)
    params = fused.init_params(rng)
    for bias in params[1::2]:  # nonzero biases, so their gradients and the ReLU masks are exercised
        bias[:] = 0.3 * rng.standard_normal(bias.shape)
    x, a, old_logp, adv, ret = fused.batch(rng, 200)
    old_logp[:50] -= 1.0  # ratios e^1 > 1 + clip: the clipped branch wins where the advantage is positive
    diffs = fused.max_grad_diff(params, (x, a, old_logp, adv, ret))
    assert set(diffs) == {"Numba step", "Numba networks in autograd"}
    assert max(diffs.values()) < 1e-5, diffs


def test_the_hand_written_adam_step_matches_torchs():
    rng = np.random.default_rng(4)
    params = fused.init_params(rng)
    data = fused.batch(rng, 64)
    flat, p = fused.views(params)
    flat_grad, g = fused.views([np.zeros_like(q) for q in params])
    m, v = np.zeros_like(flat), np.zeros_like(flat)
    actor, critic = fused.torch_nets(params)
    opt = torch.optim.Adam([*actor.parameters(), *critic.parameters()], fused.LR, betas=fused.BETAS, eps=fused.EPS)
    tensors = [torch.tensor(d) for d in data]
    for t in (1, 2, 3):
        loss = fused.step(p, g, flat, flat_grad, m, v, t, *data)
        opt.zero_grad()
        reference = fused.torch_loss(actor, critic, *tensors)
        reference.backward()
        opt.step()
        assert abs(loss - reference.item()) < 1e-5
    ours = [q.T if q.ndim == 2 else q for q in p]
    theirs = [q.detach().numpy() for net in (actor, critic) for q in net.parameters()]
    np.testing.assert_allclose(np.concatenate([o.ravel() for o in ours]),
                               np.concatenate([t.ravel() for t in theirs]), atol=1e-6)  # fmt: skip


def test_the_bench_loss_is_ippos_loss():
    """The middle road's timing of ippo.py's own update swaps in `script_loss`, the update's lines gathered in one
    function: one update with it gives the script's losses (fails when either side's loss changes alone)."""
    from bench_update import filled_rollout, load_script

    m = load_script("ippo")
    args, pol, opt, rb, _ = filled_rollout("ippo", m, num_envs=4, num_steps=8, update_epochs=2, num_minibatches=2)
    (policy, value), (policy2, value2) = fused.script_losses(m, pol, opt, rb, args)
    assert policy2 == pytest.approx(policy, rel=1e-5) and value2 == pytest.approx(value, rel=1e-5)
    assert value > 0
