"""algos/commnet.py, ic3net.py and tarmac.py, the learned-communication scripts: what each one's messages carry
(CommNet's mean, IC3Net's gate, TarMAC's attention) and that --no-comm silences them, the update's replay of the
rollout through time, messages and gates, and each script end to end with tiny budgets (in this process via
`runpy`)."""

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
ALGOS = ["commnet", "ic3net", "tarmac"]
TINY = ["--num-envs", "2", "--num-steps", "10", "--eval-episodes", "2", "--final-eval-episodes", "4",
        "--update-epochs", "2"]  # fmt: skip
SCRIPTED = "test_envs:make_scripted_env"  # action masks, a unit that dies mid-episode (tests/test_envs.py)
SPECS = {
    "unit": GroupSpec("unit", ("u0", "u1", "u2"), (4,), np.float32, True, 5),
    "scout": GroupSpec("scout", ("s0",), (2,), np.float32, True, 3),
}


@pytest.fixture(scope="module")
def scripts():
    return {a: runpy.run_path(str(ROOT / "algos" / f"{a}.py"), run_name=a) for a in ALGOS}


def run_inline(capsys, algo, *flags, check=True):
    return script_runs.run_inline(capsys, algo, *TINY, *flags, check=check)


# --- the messages ------------------------------------------------------------------------------------------------


def test_a_message_is_the_mean_of_the_other_living_agents_states_and_no_comm_zeroes_it(scripts):
    """c_i = C(mean over living j != i of h_j); a dead agent sends and receives nothing. With --no-comm an agent's
    next state depends on its own observation and state alone."""
    torch.manual_seed(0)
    net = scripts["commnet"]["CommNet"](SPECS, scripts["commnet"]["Args"](hidden_size=6))
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
    silent = scripts["commnet"]["CommNet"](SPECS, scripts["commnet"]["Args"](hidden_size=6, comm=False))
    silent.load_state_dict(net.state_dict())
    quiet = silent.step(silent.encode(obs), h, torch.ones(5, 4)), silent.step(silent.encode(obs), h2, torch.ones(5, 4))
    torch.testing.assert_close(quiet[0][:, :3], quiet[1][:, :3])


def test_a_closed_gate_sends_and_hears_nothing_and_an_open_one_hears_the_open_others(scripts):
    """c_i = C(sum over living j != i with an open gate of h_j, over the number of living others) if i is alive and
    its gate open, else 0 (IC3Net's hard attention); every gate closed: no agent hears anything."""
    torch.manual_seed(0)
    net = scripts["ic3net"]["IC3Net"](SPECS, scripts["ic3net"]["Args"](hidden_size=6))
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


def test_a_receiver_hears_the_attention_weighted_values_of_the_living_senders(scripts):
    """c_i = sum_j softmax_j(q_i . k_j / sqrt(d_k)) v_j over the living senders j, itself included (Das et al. 2019,
    Eq. 2-3); a dead agent sends and hears nothing. With --no-comm an agent's next state is its own business."""
    torch.manual_seed(0)
    net = scripts["tarmac"]["TarMAC"](SPECS, scripts["tarmac"]["Args"](hidden_size=6, key_size=3, value_size=5))
    h = torch.randn(4, 4, 6)
    alive = torch.tensor([[1.0, 1, 1, 1], [1, 0, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]])
    weights = net.attention(h, alive)
    expected = torch.zeros(4, 4, 6)
    for b in range(4):
        senders = [j for j in range(4) if alive[b, j]]
        for i in senders:
            q, keys = net.query(h[b, i]), net.key(h[b, senders])
            w = torch.softmax(keys @ q / 3**0.5, 0)
            torch.testing.assert_close(weights[b, i, senders], w)
            expected[b, i] = net.comm((w[:, None] * net.message(h[b, senders])).sum(0))
    torch.testing.assert_close(weights.sum(-1), alive)  # a living receiver's weights sum to 1, a dead one's to 0
    torch.testing.assert_close(net.messages(h, alive), expected)
    obs = {"unit": torch.randn(4, 3, 4), "scout": torch.randn(4, 1, 2)}
    h2 = h.clone()
    h2[:, 3] += 1.0  # the scout's state changes: the units hear it, unless nobody talks
    talk = net.step(net.encode(obs), h, torch.ones(4, 4)), net.step(net.encode(obs), h2, torch.ones(4, 4))
    assert (talk[0][:, :3] - talk[1][:, :3]).abs().min() > 0
    args = scripts["tarmac"]["Args"](hidden_size=6, key_size=3, value_size=5, comm=False)
    silent = scripts["tarmac"]["TarMAC"](SPECS, args)
    silent.load_state_dict(net.state_dict())
    quiet = silent.step(silent.encode(obs), h, torch.ones(4, 4)), silent.step(silent.encode(obs), h2, torch.ones(4, 4))
    torch.testing.assert_close(quiet[0][:, :3], quiet[1][:, :3])


# --- the update's replay ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ALGOS)
def test_the_update_replays_the_rollout_to_the_log_probs_and_values_it_acted_with(scripts, algo):
    """The sequences the update unrolls (from each rollout's first stored hidden states, reset where episodes begin;
    IC3Net's with the gates acted with) give back the acting-time log-probabilities (of actions, and of gates) and
    values exactly: the first epoch's ratios are 1."""
    s, gated = scripts[algo], algo == "ic3net"
    torch.manual_seed(0)
    args = s["Args"](hidden_size=8, num_steps=30, value_norm=False)
    env = envs.make("simple_spread_v3", 3, 0, backend="numba")
    specs = dict(env.groups)
    net = s[{"commnet": "CommNet", "ic3net": "IC3Net", "tarmac": "TarMAC"}[algo]](specs, args)
    rb = RolloutBuffer(30, 3, s["rollout_fields"](specs, net.n_agents, args))
    obs, starts, h, talk = env.reset(), np.ones(3, bool), torch.zeros(3, 3, 8), torch.zeros(3, 3)
    for _ in range(30):  # 25-step episodes: a reset inside the sequence
        stored = {"h": h.numpy().copy(), "starts": starts}
        if gated:
            stored["talk"] = talk.numpy().copy()
            actions, taken, logprobs, h, (talk, gate_logprobs), values = s["act"](net, obs, h, talk, "cpu")
            stored |= {"gate": talk.numpy().astype(np.int64), "gate_logprobs": gate_logprobs}
        else:
            actions, taken, logprobs, h, values = s["act"](net, obs, h, "cpu")
        step = env.step(actions)
        rb.add(**s["team_step"](obs, taken, step, specs), **{f"logprobs_{g}": lp for g, lp in logprobs.items()},
               values=values, truncated=step.truncated, final_values=0 * values, **stored)  # fmt: skip
        keep = torch.as_tensor(~step.done).float()
        h, talk, starts, obs = h * keep.view(-1, 1, 1), talk * keep.view(-1, 1), step.done, step.next
    assert rb["starts"][1:].any()
    mb = to_torch(next(rb.sequences(30, 1, np.random.default_rng(0))), "cpu")
    with torch.no_grad():
        dists, *gates, values, _ = s["unroll"](net, mb)
    if gated:
        torch.testing.assert_close(gates[0].log_prob(mb["gate"].flatten(0, 1)), mb["gate_logprobs"].flatten(0, 1))
        assert 0 < mb["talk"].mean() < 1  # the gates opened and closed: the replay had something to get right
    for g, d in dists.items():
        torch.testing.assert_close(d.log_prob(mb[f"actions_{g}"].flatten(0, 1)), mb[f"logprobs_{g}"].flatten(0, 1))
    torch.testing.assert_close(values, mb["values"])


@pytest.mark.parametrize("comm", [True, False])
def test_ic3net_without_comm_has_no_gate_its_gates_closed_and_out_of_the_update(scripts, comm):
    """--no-comm is no communication at all (the paper's independent baseline): the gates stay closed when acting
    and take no part in the update (their head gets no gradient), so the ablation is not a team PPO with an idle
    extra action. With messages the gates act and learn."""
    s = scripts["ic3net"]
    torch.manual_seed(0)
    args = s["Args"](hidden_size=8, num_steps=10, value_norm=False, comm=comm, update_epochs=2)
    env = envs.make("simple_spread_v3", 3, 0, backend="numba")
    specs = dict(env.groups)
    net = s["IC3Net"](specs, args)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    rb = RolloutBuffer(10, 3, s["rollout_fields"](specs, net.n_agents, args))
    obs, h, talk = env.reset(), torch.zeros(3, 3, 8), torch.zeros(3, 3)
    for _ in range(10):
        stored = {"h": h.numpy().copy(), "starts": np.zeros(3, bool), "talk": talk.numpy().copy()}
        actions, taken, logprobs, h, (talk, gate_logprobs), values = s["act"](net, obs, h, talk, "cpu")
        stored |= {"gate": talk.numpy().astype(np.int64), "gate_logprobs": gate_logprobs}
        step = env.step(actions)
        rb.add(**s["team_step"](obs, taken, step, specs), **{f"logprobs_{g}": lp for g, lp in logprobs.items()},
               values=values, truncated=step.truncated, final_values=0 * values, **stored)  # fmt: skip
        obs = step.next
    assert (rb["gate"].mean() > 0) == comm  # closed throughout without messages; sampled (about half open) with
    rb.compute_gae(np.zeros(3, np.float32), args.gamma, args.gae_lambda, rewards="reward")
    gate, encoders = [p.detach().clone() for p in net.gate.parameters()], net.encoders.state_dict()
    encoders = {k: v.clone() for k, v in encoders.items()}
    s["update"](net, opt, rb, args, "cpu", np.random.default_rng(0))
    moved = lambda before, after: any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))  # noqa: E731
    assert moved(gate, list(net.gate.parameters())) == comm
    assert moved(list(encoders.values()), list(net.encoders.state_dict().values()))  # the rest learns either way


# --- the scripts end to end ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ALGOS)
def test_spread_writes_events_checkpoints_and_reloads_to_the_same_greedy_actions(algo, tmp_path, capsys):
    run_inline(capsys, algo, "--total-timesteps", 200, "--eval-interval", 100, "--run-dir", tmp_path)
    for name in ("config.json", "last.pt", "best.pt", "final_eval.json", "DONE"):
        assert (tmp_path / name).exists(), name
    for tag in ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/explained_variance"):
        assert script_runs.scalars(tmp_path, tag), tag
    _, stdout, _ = run_inline(capsys, algo, "--eval-checkpoint", tmp_path / "last.pt")
    reloaded = float(re.search(r"episodic return (-?[\d.]+)", stdout).group(1))
    final = json.loads((tmp_path / "final_eval.json").read_text())["returns"][:2]
    assert reloaded == pytest.approx(float(np.mean(final)), abs=0.01)


@pytest.mark.parametrize("algo", ALGOS)
def test_same_seed_same_first_losses_and_another_seed_differs(algo, tmp_path, capsys):
    for name, seed, every in (("a", 3, 0), ("b", 3, 40), ("c", 4, 0)):  # an evaluation in between changes nothing
        flags = ["--total-timesteps", 80, "--eval-episodes", 1, "--seed", seed, "--eval-interval", every]
        run_inline(capsys, algo, *flags, "--run-dir", tmp_path / name)
    for tag in ("losses/policy_loss", "losses/value_loss"):
        a, b, c = (script_runs.scalars(tmp_path / name, tag) for name in "abc")
        assert a and a == b and a != c, tag


@pytest.mark.parametrize(
    "algo, flags",
    [
        (a, f)
        for a in ALGOS
        for f in (
            ["--env", SCRIPTED],
            ["--env", "simple_speaker_listener_v4", "--continuous-actions"],
            ["--env", "simple_reference_v3", "--no-comm"],
        )
    ],
)
def test_masks_a_dying_unit_two_groups_in_one_team_and_the_ablation(algo, flags, tmp_path, capsys):
    """The scripted env fails on a masked-out action, and its unit_2 dies mid-episode; the speaker and the listener,
    two groups, talk as one team with Gaussian policies; --no-comm trains."""
    run_inline(capsys, algo, *flags, "--total-timesteps", 120, "--eval-interval", 0, "--run-dir", tmp_path)
    assert (tmp_path / "DONE").exists() and script_runs.scalars(tmp_path, "losses/value_loss")


@pytest.mark.parametrize(
    "algo, flags, message",
    [
        ("commnet", ["--num-minibatches", 3], "--num-minibatches 3 exceeds --num-envs 2"),
        ("ic3net", ["--total-timesteps", 10], "--total-timesteps 10 is less than one rollout"),
        ("tarmac", ["--env", "simple_adversary_v3"], "are rewarded differently, so they compete"),
        ("tarmac", ["--key-size", 0], "--key-size 0 and --value-size 32 must be >= 1"),
    ],
)
def test_bad_input_fails_with_one_clear_error(algo, flags, message, capsys):
    code, _, stderr = run_inline(capsys, algo, *flags, check=False)
    assert code == 2 and "Traceback" not in stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("error:") and message.lower() in line.lower(), stderr
