"""algos/ic3net.py: the gate (a closed gate sends and hears nothing), the update's replay of the rollout through time,
messages and gates, and the script end to end with tiny budgets (in this process via `runpy`)."""

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
def ic3net():
    return runpy.run_path(str(ROOT / "algos" / "ic3net.py"), run_name="ic3net")


def run_inline(capsys, *flags, check=True):
    return script_runs.run_inline(capsys, "ic3net", *TINY, *flags, check=check)


def test_a_closed_gate_sends_and_hears_nothing_and_an_open_one_hears_the_open_others(ic3net):
    """c_i = C(sum over living j != i with an open gate of h_j, over the number of living others) if i is alive and
    its gate open, else 0 (IC3Net's hard attention); every gate closed: no agent hears anything."""
    torch.manual_seed(0)
    net = ic3net["IC3Net"](SPECS, ic3net["Args"](hidden_size=6))
    h = torch.randn(4, 4, 6)
    alive = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 1], [1, 0, 1, 1], [1, 1, 1, 1]])
    talk = torch.tensor([[1.0, 1, 1, 1], [1, 0, 1, 0], [1, 1, 0, 1], [0, 0, 0, 0]])
    expected = torch.zeros(4, 4, 6)
    for b in range(4):
        for i in range(4):
            if alive[b, i] and talk[b, i]:
                others = [j for j in range(4) if j != i and alive[b, j]]
                heard = sum((h[b, j] for j in others if talk[b, j]), torch.zeros(6)) / max(len(others), 1)
                expected[b, i] = net.comm(heard)
    got = net.messages(h, alive, talk)
    torch.testing.assert_close(got, expected)
    assert got[3].abs().max() == 0 and got[1, [1, 3]].abs().max() == 0  # closed gates hear nothing
    obs = {"unit": torch.randn(4, 3, 4), "scout": torch.randn(4, 1, 2)}
    h2 = h.clone()
    h2[:, 3] += 1.0  # the scout's state changes: heard only through its open gate
    steps = [net.step(net.encode(obs), x, torch.ones(4, 4), talk) for x in (h, h2)]
    torch.testing.assert_close(steps[0][[1, 3], :3], steps[1][[1, 3], :3])  # scout silent (b=1) or all closed (b=3)
    assert (steps[0][0, :3] - steps[1][0, :3]).abs().min() > 0  # everyone open: the units hear the scout


def test_the_update_replays_the_rollout_to_the_log_probs_and_values_it_acted_with(ic3net):
    """The sequences the update unrolls (from each rollout's first stored hidden states, reset where episodes begin,
    with the gates acted with) give back the acting-time log-probabilities of actions and gates and the values
    exactly: the first epoch's ratios are 1."""
    torch.manual_seed(0)
    args = ic3net["Args"](hidden_size=8, num_steps=30, value_norm=False)
    env = envs.make("simple_spread_v3", 3, 0, backend="numba")
    specs = dict(env.groups)
    net = ic3net["IC3Net"](specs, args)
    rb = RolloutBuffer(30, 3, ic3net["rollout_fields"](specs, net.n_agents, args))
    obs, starts, h, talk = env.reset(), np.ones(3, bool), torch.zeros(3, 3, 8), torch.zeros(3, 3)
    for _ in range(30):  # 25-step episodes: a reset inside the sequence
        h_before, talk_before = h.numpy().copy(), talk.numpy().copy()
        actions, taken, logprobs, h, (talk, gate_logprobs), values = ic3net["act"](net, obs, h, talk, "cpu")
        step = env.step(actions)
        team = ic3net["team_step"](obs, taken, step, specs)
        rb.add(**team, **{f"logprobs_{g}": lp for g, lp in logprobs.items()}, values=values,
               truncated=step.truncated, final_values=0 * values, h=h_before, talk=talk_before,
               gate=talk.numpy().astype(np.int64), gate_logprobs=gate_logprobs, starts=starts)  # fmt: skip
        keep = torch.as_tensor(~step.done).float()
        h, talk, starts, obs = h * keep.view(-1, 1, 1), talk * keep.view(-1, 1), step.done, step.next
    assert rb["starts"][1:].any()
    mb = to_torch(next(rb.sequences(30, 1, np.random.default_rng(0))), "cpu")
    with torch.no_grad():
        dists, gates, values, _ = ic3net["unroll"](net, mb)
    torch.testing.assert_close(gates.log_prob(mb["gate"].flatten(0, 1)), mb["gate_logprobs"].flatten(0, 1))
    assert 0 < mb["talk"].mean() < 1  # the gates opened and closed: the replay had something to get right
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
