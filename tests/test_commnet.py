"""algos/commnet.py: what the messages carry (and that --no-comm zeroes them), the update's replay of the rollout
through time and messages, and the script end to end with tiny budgets (in this process via `runpy`)."""

import json
import re
import runpy
from pathlib import Path

import numpy as np
import pytest
import script_runs
import torch

import envs
from buffers import RolloutBuffer, to_torch
from envs.api import GroupSpec

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--num-envs", "2", "--num-steps", "10", "--eval-episodes", "2", "--final-eval-episodes", "4",
        "--update-epochs", "2"]  # fmt: skip
SCRIPTED = "test_envs:make_scripted_env"  # action masks, a unit that dies mid-episode (tests/test_envs.py)
SPECS = {
    "unit": GroupSpec("unit", ("u0", "u1", "u2"), (4,), np.float32, True, 5),
    "scout": GroupSpec("scout", ("s0",), (2,), np.float32, True, 3),
}


@pytest.fixture(scope="module")
def commnet():
    return runpy.run_path(str(ROOT / "algos" / "commnet.py"), run_name="commnet")


def run_inline(capsys, *flags, check=True):
    return script_runs.run_inline(capsys, "commnet", *TINY, *flags, check=check)


def test_a_message_is_the_mean_of_the_other_living_agents_states_and_no_comm_zeroes_it(commnet):
    """c_i = C(mean over living j != i of h_j); a dead agent sends and receives nothing. With --no-comm an agent's
    next state depends on its own observation and state alone."""
    torch.manual_seed(0)
    net = commnet["CommNet"](SPECS, commnet["Args"](hidden_size=6))
    h = torch.randn(5, 4, 6)
    alive = torch.tensor([[1.0, 1, 1, 1], [1, 0, 1, 1], [1, 1, 0, 0], [0, 0, 0, 1], [1, 1, 1, 1]])
    expected = torch.zeros(5, 4, 6)
    for b in range(5):
        for i in range(4):
            others = [j for j in range(4) if j != i and alive[b, j]]
            if alive[b, i]:
                c = h[b, others].mean(0) if others else torch.zeros(6)
                expected[b, i] = net.comm(c)
    torch.testing.assert_close(net.messages(h, alive), expected)
    obs = {"unit": torch.randn(5, 3, 4), "scout": torch.randn(5, 1, 2)}
    h2 = h.clone()
    h2[:, 3] += 1.0  # the scout's state changes: the units hear it, unless nobody talks
    talk = net.step(net.encode(obs), h, torch.ones(5, 4)), net.step(net.encode(obs), h2, torch.ones(5, 4))
    assert (talk[0][:, :3] - talk[1][:, :3]).abs().min() > 0
    silent = commnet["CommNet"](SPECS, commnet["Args"](hidden_size=6, comm=False))
    silent.load_state_dict(net.state_dict())
    quiet = silent.step(silent.encode(obs), h, torch.ones(5, 4)), silent.step(silent.encode(obs), h2, torch.ones(5, 4))
    torch.testing.assert_close(quiet[0][:, :3], quiet[1][:, :3])


def test_the_update_replays_the_rollout_to_the_log_probs_and_values_it_acted_with(commnet):
    """The sequences the update unrolls (from each rollout's first stored hidden states, reset where episodes begin)
    give back the acting-time log-probabilities and values exactly: the first epoch's ratios are 1."""
    torch.manual_seed(0)
    args = commnet["Args"](hidden_size=8, num_steps=30, value_norm=False)
    env = envs.make("simple_spread_v3", 3, 0, backend="numba")
    specs = dict(env.groups)
    net = commnet["CommNet"](specs, args)
    rb = RolloutBuffer(30, 3, commnet["rollout_fields"](specs, net.n_agents, args))
    obs, starts, h = env.reset(), np.ones(3, bool), torch.zeros(3, 3, 8)
    for _ in range(30):  # 25-step episodes: a reset inside the sequence
        h_before = h.numpy().copy()
        actions, taken, logprobs, h, values = commnet["act"](net, obs, h, "cpu")
        step = env.step(actions)
        team = commnet["team_step"](obs, taken, step, specs)
        rb.add(**team, **{f"logprobs_{g}": lp for g, lp in logprobs.items()}, values=values,
               truncated=step.truncated, final_values=0 * values, h=h_before, starts=starts)  # fmt: skip
        h, starts, obs = h * torch.as_tensor(~step.done).view(-1, 1, 1), step.done, step.next
    assert rb["starts"][1:].any()
    mb = to_torch(next(rb.sequences(30, 1, np.random.default_rng(0))), "cpu")
    with torch.no_grad():
        dists, values, _ = commnet["unroll"](net, mb)
    for g, d in dists.items():
        torch.testing.assert_close(d.log_prob(mb[f"actions_{g}"].flatten(0, 1)), mb[f"logprobs_{g}"].flatten(0, 1))
    torch.testing.assert_close(values, mb["values"])


def test_spread_writes_events_checkpoints_and_reloads_to_the_same_greedy_actions(tmp_path, capsys):
    run_inline(capsys, "--total-timesteps", 200, "--eval-interval", 100, "--run-dir", tmp_path)
    for name in ("config.json", "last.pt", "best.pt", "final_eval.json", "DONE"):
        assert (tmp_path / name).exists(), name
    for tag in ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/explained_variance"):
        assert script_runs.scalars(tmp_path, tag), tag
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
     ["--env", "simple_reference_v3", "--no-comm"]],
)  # fmt: skip
def test_masks_a_dying_unit_two_groups_in_one_team_and_the_ablation(flags, tmp_path, capsys):
    """The scripted env fails on a masked-out action, and its unit_2 dies mid-episode; the speaker and the listener,
    two groups, talk as one team with Gaussian policies; --no-comm trains."""
    run_inline(capsys, *flags, "--total-timesteps", 120, "--eval-interval", 0, "--run-dir", tmp_path)
    assert (tmp_path / "DONE").exists() and script_runs.scalars(tmp_path, "losses/value_loss")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--num-minibatches", 3], "--num-minibatches 3 exceeds --num-envs 2"),
        (["--total-timesteps", 10], "--total-timesteps 10 is less than one rollout"),
        (["--env", "simple_adversary_v3"], "are rewarded differently, so they compete"),
    ],
)
def test_bad_input_fails_with_one_clear_error(flags, message, capsys):
    code, _, stderr = run_inline(capsys, *flags, check=False)
    assert code == 2 and "Traceback" not in stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("error:") and message.lower() in line.lower(), stderr
