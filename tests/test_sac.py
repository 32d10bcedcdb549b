"""algos/isac.py and algos/masac.py: the squashed Gaussian's log-probability against a numerical change of variables,
the discrete soft value against a plain expectation, the temperature's direction, and the SAC-only errors. The runs
every off-policy actor-critic shares (checkpoints, same seed, prioritized, heterogeneous groups, masks, resume) are in
tests/test_maddpg.py."""

import math
import runpy
from pathlib import Path

import numpy as np
import pytest
import script_runs
import torch

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--backend", "pettingzoo", "--num-envs", "2", "--eval-episodes", "2", "--buffer-size", "1000",
        "--batch-size", "16", "--learning-starts", "32", "--train-frequency", "4", "--log-interval", "20",
        "--final-eval-episodes", "4", "--eval-interval", "0"]  # fmt: skip


@pytest.fixture(scope="module", params=["isac", "masac"])
def sac(request):
    return runpy.run_path(str(ROOT / "algos" / f"{request.param}.py"), run_name=request.param)


def test_squashed_gaussian_log_prob_equals_a_numerical_change_of_variables(sac):
    torch.manual_seed(0)
    B, d = 64, 3
    mean, log_std = torch.randn(B, d, dtype=torch.float64) * 2, torch.rand(B, d, dtype=torch.float64) * 3 - 2
    low, high = torch.tensor([0.0, -2.0, 1.0], dtype=torch.float64), torch.tensor([1.0, 2.0, 1.5], dtype=torch.float64)
    torch.manual_seed(1)
    a, log_prob = sac["squashed_gaussian"](mean, log_std, low, high)
    torch.manual_seed(1)
    u = mean + log_std.exp() * torch.randn_like(mean)  # the same pre-squash sample
    squash = lambda u: low + (torch.tanh(u) + 1) * (high - low) / 2  # noqa: E731
    torch.testing.assert_close(a, squash(u))
    h = 1e-6  # log p(a) = log N(u; mean, std) - sum_j log |da_j / du_j|, the derivative by central differences
    jacobian = (squash(u + h) - squash(u - h)) / (2 * h)
    expected = torch.distributions.Normal(mean, log_std.exp()).log_prob(u).sum(-1) - jacobian.log().sum(-1)
    torch.testing.assert_close(log_prob, expected, rtol=1e-6, atol=1e-5)


def test_squashed_gaussian_density_integrates_to_one_and_is_finite_at_the_bounds(sac):
    # one dimension on [low, high]: the density of a, written through the function at the u that maps to each a
    mean, log_std, low, high = (torch.tensor([x], dtype=torch.float64) for x in (0.7, -0.3, -1.0, 3.0))
    a = torch.linspace(-1.0, 3.0, 200_001, dtype=torch.float64)[1:-1, None]
    u = torch.atanh((a - low) / (high - low) * 2 - 1)
    log_prob = sac["squashed_gaussian"](u, torch.full_like(u, -60.0), low, high, greedy=True)[1]  # at u itself
    log_prob -= 60.0 - 0.5 * math.log(2 * math.pi)  # remove the degenerate Gaussian's own log-density at its mean
    gauss = torch.distributions.Normal(mean, log_std.exp()).log_prob(u)[:, 0]
    density = (log_prob + gauss).exp()
    assert torch.trapezoid(density, a[:, 0]).item() == pytest.approx(1.0, abs=1e-4)
    # far in the tails tanh saturates: log(1 - tanh(u)^2) computed stably, no inf or nan
    _, far = sac["squashed_gaussian"](torch.tensor([[30.0, -30.0]]), torch.zeros(1, 2), low, high, greedy=True)
    assert torch.isfinite(far).all() and far.item() > 100


def test_discrete_soft_value_is_the_plain_expectation(sac):
    rng = np.random.default_rng(0)
    B, A, n, alpha = 5, 3, 4, 0.3
    q = rng.normal(size=(B, A, n))
    logits = rng.normal(size=(B, A, n))
    logits[0, 0, 2] = -np.inf  # an unavailable action: probability 0, and no 0 * log 0 = nan
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        log_probs = np.maximum(np.log(probs), -1e9)
    expected = np.zeros((B, A))
    for b in range(B):
        for i in range(A):
            for a in range(n):
                if probs[b, i, a] > 0:
                    expected[b, i] += probs[b, i, a] * (q[b, i, a] - alpha * log_probs[b, i, a])
    t = lambda x: torch.tensor(x)  # noqa: E731
    np.testing.assert_allclose(sac["soft_values"](t(q), t(log_probs), alpha, t(probs)).numpy(), expected, rtol=1e-12)
    # continuous: at the sampled action, Q - alpha log pi
    np.testing.assert_allclose(sac["soft_values"](t(q[..., 0]), t(log_probs[..., 0]), alpha).numpy(),
                               q[..., 0] - alpha * log_probs[..., 0])  # fmt: skip


def test_actor_masks_unavailable_actions(sac):
    from envs.api import GroupSpec

    spec = GroupSpec("unit", ("u0", "u1"), (4,), np.float32, True, 5, has_action_mask=True)
    actor = sac["Actor"](spec, sac["Args"]())
    avail = torch.tensor([[1, 0, 1, 0, 0], [0, 0, 0, 1, 0]], dtype=torch.float32).expand(64, 2, 5)
    probs, log_probs = actor.policy(torch.randn(64, 2, 4), avail)
    assert (probs[avail == 0] == 0).all() and torch.isfinite(log_probs).all()
    actions, _ = actor.sample(torch.randn(64, 2, 4), avail)
    assert (actions * (1 - avail)).sum() == 0  # one-hot samples land on available actions only


@pytest.mark.parametrize("algo", ["isac", "masac"])
@pytest.mark.parametrize("flags", [[], ["--no-continuous-actions"]])
def test_autotuned_alpha_moves_toward_the_target_entropy(algo, flags, tmp_path, capsys):
    """A target above the policy's entropy raises alpha (more entropy is rewarded), one below lowers it."""
    trends = {}
    for target in ("high", "low"):
        value = {"high": 1.6094 if flags else 5.0, "low": -20.0}[target]  # discrete: just below log 5 = 1.60944
        run_dir = tmp_path / target
        script_runs.run_inline(capsys, algo, *TINY, *flags, "--total-timesteps", 200, "--alpha-lr", 0.05,
                               "--target-entropy", value, "--run-dir", run_dir)  # fmt: skip
        alpha = [v for _, v in script_runs.scalars(run_dir, "losses/alpha")]
        entropy = [v for _, v in script_runs.scalars(run_dir, "losses/entropy")]
        assert len(alpha) >= 3 and all(math.isfinite(e) for e in entropy)
        trends[target] = alpha[-1] - alpha[0]
    assert trends["high"] > 0 > trends["low"], trends
    # without --autotune alpha stays where it was set
    script_runs.run_inline(capsys, algo, *TINY, *flags, "--total-timesteps", 100, "--no-autotune", "--alpha", 0.2,
                           "--run-dir", tmp_path / "fixed")  # fmt: skip
    assert {round(v, 6) for _, v in script_runs.scalars(tmp_path / "fixed", "losses/alpha")} == {0.2}


@pytest.mark.parametrize(
    "algo, flags, message",
    [
        ("masac", ["--alpha", 0], "--alpha 0.0 must be > 0"),
        ("isac", ["--alpha-lr", -1], "--alpha-lr -1.0 must be > 0"),
        ("masac", ["--no-continuous-actions", "--target-entropy", 2.0, "--total-timesteps", 50],
         "--target-entropy 2.0 is out of reach for agent's 5 actions"),
        ("isac", ["--env", "battle_v4"], "battle_v4 has no continuous actions"),
    ],
)  # fmt: skip
def test_bad_input_fails_with_one_clear_error(algo, flags, message, capsys):
    code, _, stderr = script_runs.run_inline(capsys, algo, *TINY, *flags, check=False)
    assert code == 2 and "Traceback" not in stderr
    assert stderr.startswith("error:") and message.lower() in stderr.lower(), stderr
