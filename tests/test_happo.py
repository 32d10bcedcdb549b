"""algos/happo.py: the sequential update's correction factor, agents that move alone, and the script end to end with
tiny budgets (in this process via `runpy`)."""

import json
import re
import runpy
from pathlib import Path

import numpy as np
import pytest
import script_runs
import torch

from buffers import RolloutBuffer
from envs.api import GroupSpec

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--num-envs", "2", "--num-steps", "10", "--eval-episodes", "2", "--final-eval-episodes", "4",
        "--update-epochs", "2"]  # fmt: skip
SCRIPTED = "test_envs:make_scripted_env"  # action masks, a unit that dies mid-episode (tests/test_envs.py)
SPECS = {"unit": GroupSpec("unit", ("u0", "u1", "u2"), (4,), np.float32, True, 5, has_action_mask=True)}


@pytest.fixture(scope="module")
def happo():
    return runpy.run_path(str(ROOT / "algos" / "happo.py"), run_name="happo")


def run_inline(capsys, *flags, check=True):
    return script_runs.run_inline(capsys, "happo", *TINY, *flags, check=check)


def rollout(happo, actors, T=12, E=3, seed=0):
    """A full rollout of random steps acted by the unit group's `actors`, with GAE computed, some agents dead and
    actions masked."""
    rng = np.random.default_rng(seed)
    rb = RolloutBuffer(T, E, happo["rollout_fields"](SPECS, (7,)))
    for _ in range(T):
        avail = rng.random((E, 3, 5)) < 0.6
        avail[..., 0] = True
        obs = rng.normal(size=(E, 3, 4)).astype(np.float32)
        with torch.no_grad():
            dists = [actors.dist(torch.as_tensor(obs), i, torch.as_tensor(avail)) for i in range(3)]
            actions = torch.stack([d.sample() for d in dists], 1)
            logprobs = torch.stack([d.log_prob(actions[:, i]) for i, d in enumerate(dists)], 1)
        rb.add(
            obs_unit=obs,
            actions_unit=actions.numpy(),
            logprobs_unit=logprobs.numpy(),
            agent_mask_unit=rng.random((E, 3)) < 0.8,
            avail_unit=avail,
            state=rng.normal(size=(E, 7)).astype(np.float32),
            values=rng.normal(size=E).astype(np.float32),
            reward=rng.normal(size=E).astype(np.float32),
            terminated=rng.random(E) < 0.1,
            truncated=np.zeros(E, bool),
            final_values=np.zeros(E, np.float32),
        )
    rb.compute_gae(np.zeros(E, np.float32), 0.95, 0.95, rewards="reward")
    return rb


def log_probs(actors, rb, i):
    obs, avail = torch.as_tensor(rb["obs_unit"]).flatten(0, 1), torch.as_tensor(rb["avail_unit"]).flatten(0, 1)
    with torch.no_grad():
        d = actors.dist(obs, i, avail)
        return d.log_prob(torch.as_tensor(rb["actions_unit"]).flatten(0, 1)[:, i]).view(rb["values"].shape).numpy()


def test_each_agent_learns_on_the_product_of_its_predecessors_ratios_and_moves_nothing_else(happo):
    """The paper's correction M for the k-th agent of the order is prod over the earlier agents j of
    pi_j,new(a_j | o_j) / pi_j,old(a_j | o_j) (Zhong et al. 2024, Eq. 11; a dead agent's factor is 1); an agent's
    update changes its own actor only (one optimizer per actor: Adam's momentum never moves another's)."""
    torch.manual_seed(0)
    args = happo["Args"](update_epochs=3, num_minibatches=2, learning_rate=3e-3)
    actors = happo["Team"](SPECS, 7, args).groups["unit"]
    rb = rollout(happo, actors)
    old = {i: rb["logprobs_unit"][..., i].copy() for i in range(3)}
    optimizers = [torch.optim.Adam(a.parameters(), lr=args.learning_rate) for a in actors.actors]
    rng, order, seen = np.random.default_rng(1), [2, 0, 1], {}
    rb.targets["factor"] = np.ones_like(rb["values"])
    for i in order:
        seen[i] = rb.targets["factor"].copy()
        before = [[p.detach().clone() for p in a.parameters()] for a in actors.actors]
        happo["update_agent"](actors, "unit", i, optimizers[i], rb, args, "cpu", rng)
        for j, a in enumerate(actors.actors):
            moved = any(not torch.equal(p, q) for p, q in zip(a.parameters(), before[j], strict=True))
            assert moved == (j == i), (i, j)
    alive = rb["agent_mask_unit"]
    ratios = {i: np.where(alive[..., i], np.exp(log_probs(actors, rb, i) - old[i]), 1.0) for i in range(3)}
    assert np.all(seen[2] == 1.0)  # the first agent of the order learns on the plain advantage
    np.testing.assert_allclose(seen[0], ratios[2], rtol=1e-5)
    np.testing.assert_allclose(seen[1], ratios[2] * ratios[0], rtol=1e-5)
    np.testing.assert_allclose(rb.targets["factor"], ratios[2] * ratios[0] * ratios[1], rtol=1e-5)
    assert np.abs(seen[1] - 1).max() > 1e-3  # the updates moved the policies, so the factor is not trivially 1


def test_without_the_sequential_correction_every_agent_learns_on_the_plain_advantage(happo):
    """--no-sequential, the ablation: M stays 1 however far the earlier agents' policies moved."""
    torch.manual_seed(0)
    args = happo["Args"](update_epochs=3, num_minibatches=2, learning_rate=3e-3, sequential=False)
    actors = happo["Team"](SPECS, 7, args).groups["unit"]
    rb = rollout(happo, actors)
    old = rb["logprobs_unit"].copy()
    rb.targets["factor"] = np.ones_like(rb["values"])
    for i in (2, 0, 1):
        happo["update_agent"](actors, "unit", i, torch.optim.Adam(actors.actor_of(i).parameters(), lr=3e-3), rb,
                              args, "cpu", np.random.default_rng(1))  # fmt: skip
        assert np.all(rb.targets["factor"] == 1.0)
    assert max(np.abs(log_probs(actors, rb, i) - old[..., i]).max() for i in range(3)) > 1e-3  # they did learn


def test_separate_actors_by_default_and_one_shared_actor_with_ids_on_request(happo):
    separate = happo["Team"](SPECS, 7, happo["Args"]()).groups["unit"]
    shared = happo["Team"](SPECS, 7, happo["Args"](share_params=True)).groups["unit"]
    assert len(separate.actors) == 3 and len(shared.actors) == 1
    assert separate.actors[0].net[0].in_features == 4 and shared.actors[0].net[0].in_features == 4 + 3


@pytest.mark.parametrize("flags", [[], ["--share-params", "--fixed-order"], ["--no-sequential"]])
def test_spread_writes_events_checkpoints_and_reloads_to_the_same_greedy_actions(flags, tmp_path, capsys):
    run_inline(capsys, *flags, "--total-timesteps", 200, "--eval-interval", 100, "--run-dir", tmp_path)
    for name in ("config.json", "last.pt", "best.pt", "final_eval.json", "DONE"):
        assert (tmp_path / name).exists(), name
    for tag in ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/explained_variance"):
        assert script_runs.scalars(tmp_path, tag), tag
    optimizers = torch.load(tmp_path / "last.pt", weights_only=True)["optimizers"]
    assert len(optimizers) == (
        2 if "--share-params" in flags else 4
    )  # an Adam per actor (3, or 1 shared), the critic's
    _, stdout, _ = run_inline(capsys, "--eval-checkpoint", tmp_path / "last.pt")
    reloaded = float(re.search(r"episodic return (-?[\d.]+)", stdout).group(1))
    final = json.loads((tmp_path / "final_eval.json").read_text())["returns"][:2]
    assert reloaded == pytest.approx(float(np.mean(final)), abs=0.01)


def test_same_seed_same_first_losses_and_another_seed_differs(tmp_path, capsys):
    for name, seed, every in (("a", 3, 0), ("b", 3, 40), ("c", 4, 0)):  # an evaluation in between changes nothing
        run_inline(capsys, "--total-timesteps", 80, "--eval-episodes", 1, "--seed", seed, "--eval-interval", every,
                   "--run-dir", tmp_path / name)  # fmt: skip
    for tag in ("losses/policy_loss", "losses/value_loss"):
        a, b, c = (script_runs.scalars(tmp_path / name, tag) for name in "abc")
        assert a and a == b and a != c, tag


@pytest.mark.parametrize(
    "flags",
    [["--env", SCRIPTED], ["--env", "simple_speaker_listener_v4", "--continuous-actions"],
     ["--env", "simple_adversary_v3", "--random-groups", "adversary"]],
)  # fmt: skip
def test_masks_a_dying_unit_continuous_actions_and_two_groups_in_one_team(flags, tmp_path, capsys):
    """The scripted env fails on a masked-out action, and its unit_2 dies mid-episode; the speaker and the listener,
    two groups, are one team that learns Gaussian policies; an adversary frozen to random actions is no learner."""
    run_inline(capsys, *flags, "--total-timesteps", 120, "--eval-interval", 0, "--run-dir", tmp_path)
    assert (tmp_path / "DONE").exists() and script_runs.scalars(tmp_path, "losses/value_loss")
    optimizers = torch.load(tmp_path / "last.pt", weights_only=True)["optimizers"]
    expected = {SCRIPTED: {"critic", "unit.0", "unit.1", "unit.2"},
                "simple_speaker_listener_v4": {"critic", "speaker.0", "listener.0"},
                "simple_adversary_v3": {"critic", "agent.0", "agent.1"}}[flags[1]]  # fmt: skip
    assert set(optimizers) == expected


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--num-minibatches", 100], "--num-minibatches 100 exceeds the rollout's 20 env steps"),
        (["--total-timesteps", 10], "--total-timesteps 10 is less than one rollout"),
        (["--env", "simple_adversary_v3"], "are rewarded differently, so they compete"),
    ],
)
def test_bad_input_fails_with_one_clear_error(flags, message, capsys):
    code, _, stderr = run_inline(capsys, *flags, check=False)
    assert code == 2 and "Traceback" not in stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("error:") and message.lower() in line.lower(), stderr
