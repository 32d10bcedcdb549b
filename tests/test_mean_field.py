"""algos/mfq.py and algos/mfac.py: the Boltzmann target, replay that never pairs two episodes, the mean action the
scripts act and learn on, MF-AC's advantage and targets, errors."""

import runpy
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from script_runs import run_inline, scalars

from buffers import ReplayBuffer
from buffers import RolloutBuffer as MFAC_RB
from buffers.kernels import neighbour_mean_actions

ALGOS = Path(__file__).resolve().parents[1] / "algos"
MFQ = runpy.run_path(str(ALGOS / "mfq.py"), run_name="mfq")
MFAC = runpy.run_path(str(ALGOS / "mfac.py"), run_name="mfac")
TINY = ["--num-envs", 2, "--learning-starts", 40, "--batch-size", 4, "--train-frequency", 4, "--eval-interval", 0,
        "--eval-episodes", 2, "--final-eval-episodes", 2, "--log-interval", 10]  # fmt: skip


def test_boltzmann_value_is_the_max_at_zero_temperature_and_the_mean_at_a_high_one():
    q = torch.tensor([[1.0, 3.0, 2.0], [0.5, -1.0, 4.0]])
    avail = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert torch.equal(MFQ["boltzmann_value"](q, q, 0.0), q.max(-1).values)
    np.testing.assert_allclose(MFQ["boltzmann_value"](q, q, 1e-4), q.max(-1).values, atol=1e-6)
    np.testing.assert_allclose(MFQ["boltzmann_value"](q, q, 1e-4, avail), [3.0, 0.5], atol=1e-6)  # the best available
    np.testing.assert_allclose(MFQ["boltzmann_value"](q, q, 1e6, avail), [2.0, -0.25], atol=1e-4)  # uniform
    # decoupled: the policy of one Q, the values of another (the online Q picks, the target Q values)
    np.testing.assert_allclose(MFQ["boltzmann_value"](q, -q, 1e-4), -q.max(-1).values, atol=1e-6)


def test_replay_pairs_each_step_with_the_next_mean_action_of_its_own_episode(tmp_path, capsys):
    """Episodes of 5 steps: within an episode a row's next mean action is the next row's mean action; at an
    episode's last step it is its own, never the next episode's first."""
    rows = []
    original = ReplayBuffer.add

    def record(self, **step):
        rows.append({k: v.copy() for k, v in step.items()})
        return original(self, **step)

    with mock.patch.object(ReplayBuffer, "add", record):
        run_inline(capsys, "mfq", *TINY, "--max-cycles", 5, "--total-timesteps", 80, "--run-dir", tmp_path)
    assert len(rows) == 80 // 2 - 1  # every step but the last (its next mean action never came)
    for i in range(len(rows) - 1):
        ended = (i + 1) % 5 == 0  # steps 4, 9, ... end an episode (the time limit)
        want = rows[i]["mean_agent"] if ended else rows[i + 1]["mean_agent"]
        np.testing.assert_array_equal(rows[i]["next_mean_agent"], want)
    # the stored mean is the mean of the other agents' stored actions (group: every other living agent)
    for r in rows:
        np.testing.assert_allclose(
            r["mean_agent"], neighbour_mean_actions(None, r["agent_mask_agent"], r["actions_agent"], 5)
        )
    assert scalars(tmp_path, "losses/td_loss")


@pytest.mark.parametrize("radius", [0, 6])
def test_acting_averages_over_the_view_on_grid_envs(radius, tmp_path, capsys):
    flags = ["--env", "battle_v4", "--map-size", 12, "--max-cycles", 20, "--total-timesteps", 80]
    stored = []
    original = ReplayBuffer.add

    def record(self, **step):
        stored.append(step["mean_red"].copy())
        return original(self, **step)

    with mock.patch.object(ReplayBuffer, "add", record):
        run_inline(capsys, "mfq", *TINY, *flags, "--view-radius", radius, "--run-dir", tmp_path)
    means = np.stack(stored)
    # two agents per team, on distinct cells 2 apart at the start: no neighbour within 0, each other within 6
    assert (means == 0).all() if radius == 0 else np.allclose(means[0].sum(-1), 1.0)


def test_mfac_q_advantage_is_zero_in_expectation_and_the_returns_are_td_lambda(tmp_path, capsys):
    from envs.api import GroupSpec

    spec = GroupSpec("g", ("a", "b"), (4,), np.dtype(np.float32), True, 5)
    agents = MFAC["Agents"](spec, MFAC["Args"](critic="q"))
    obs, mean = torch.randn(7, 2, 4), torch.softmax(torch.randn(7, 2, 5), -1)
    probs, q = agents.policy(obs).probs, agents.q(obs, mean)
    value = MFAC["value"](agents, obs.numpy(), mean.numpy(), "cpu")
    np.testing.assert_allclose((probs * (q - torch.as_tensor(value)[..., None])).sum(-1).detach(), 0.0, atol=1e-5)
    # the critic's targets: TD(lambda) over the stored values, as the reference computes them
    from buffers import reference

    captured = {}
    original = MFAC_RB.compute_td_lambda

    def spy(self, last_values, gamma, lam, **names):
        out = original(self, last_values, gamma, lam, **names)
        d = self.data
        T, E, A = d["values"].shape
        next_values = np.concatenate([d["values"][1:], last_values[None]], 0)
        truncated = np.broadcast_to(d["truncated"][..., None], (T, E, A))
        next_values = np.where(truncated, d["final_values"], next_values)
        ends = d["terminated"] | truncated
        captured["want"] = reference.td_lambda(
            d["rewards"].reshape(T, -1),
            next_values.reshape(T, -1),
            d["terminated"].reshape(T, -1),
            ends.reshape(T, -1),
            gamma,
            lam,
        )
        captured["got"] = out.reshape(T, -1)
        return out

    with mock.patch.object(MFAC_RB, "compute_td_lambda", spy):
        run_inline(capsys, "mfac", "--num-envs", 2, "--num-steps", 10, "--max-cycles", 7, "--total-timesteps", 20,
                   "--eval-interval", 0, "--final-eval-episodes", 2, "--run-dir", tmp_path)  # fmt: skip
    np.testing.assert_allclose(captured["got"], captured["want"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("algo", ["mfq", "mfac"])
def test_battle_with_self_play_runs(algo, tmp_path, capsys):
    flags = ["--env", "battle_v4", "--map-size", 12, "--max-cycles", 20, "--self-play", "blue", "--self-play-interval",
             40, "--total-timesteps", 100]  # fmt: skip
    extra = TINY if algo == "mfq" else ["--num-envs", 2, "--num-steps", 10, "--eval-interval", 0,
                                        "--final-eval-episodes", 2]  # fmt: skip
    run_inline(capsys, algo, *extra, *flags, "--run-dir", tmp_path)
    assert (tmp_path / "DONE").exists() and len(list((tmp_path / "pool").glob("*.pt"))) >= 2


BAD = [
    (["--mean-over", "view"], "--mean-over view needs agent positions, and simple_spread_v3 has none"),
    (["--view-radius", -1], "--view-radius -1.0 must be >= 0"),
    (["--continuous-actions"], "{algo} needs discrete actions"),
]


@pytest.mark.parametrize(
    "algo, flags, message",
    [("mfq", *bad) for bad in BAD]
    + [("mfac", *bad) for bad in BAD]
    + [("mfq", ["--temperature-end", 0], "--temperature-start and --temperature-end must be > 0")],
)
def test_bad_input_fails_with_one_clear_error(algo, flags, message, capsys):
    base = TINY if algo == "mfq" else ["--num-envs", 2, "--num-steps", 10]
    code, _, err = run_inline(capsys, algo, *base, "--total-timesteps", 40, *flags, check=False)
    assert code == 2 and message.format(algo=algo) in err, err


def test_mfac_critic_v_is_a_state_value_and_the_actor_follows_returns_minus_it():
    """--critic v (the authors' code): one critic output, V(o, a_mean), is the value the targets bootstrap from, and
    the policy loss weighs log pi(a|o) by returns - V (detached), dead agents' steps excluded."""
    from envs.api import GroupSpec

    spec = GroupSpec("g", ("a", "b"), (4,), np.dtype(np.float32), True, 5)
    args = MFAC["Args"](critic="v")
    torch.manual_seed(0)
    agents = MFAC["Agents"](spec, args)
    T, E, rng = 6, 3, np.random.default_rng(0)
    obs = rng.normal(size=(T, E, 2, 4)).astype(np.float32)
    mean = rng.dirichlet(np.ones(5), size=(T, E, 2)).astype(np.float32)
    v = MFAC["value"](agents, obs, mean, "cpu")
    assert v.shape == (T, E, 2)
    np.testing.assert_allclose(v, agents.q(torch.as_tensor(obs), torch.as_tensor(mean))[..., 0].detach(), atol=1e-6)
    rb = MFAC_RB(T, E, MFAC["rollout_fields"](spec))
    alive = rng.random((T, E, 2)) > 0.2
    for i in range(T):
        rb.add(obs=obs[i], actions=rng.integers(0, 5, (E, 2)), mean=mean[i], values=v[i],
               rewards=rng.normal(size=(E, 2)), terminated=np.zeros((E, 2), bool), truncated=np.zeros(E, bool),
               final_values=np.zeros((E, 2)), alive=alive[i])  # fmt: skip
    rb.compute_td_lambda(np.zeros((E, 2), np.float32), 0.9, 0.8)
    d = {k: torch.as_tensor(x) for k, x in (rb.data | rb.targets).items()}
    with torch.no_grad():
        logp = agents.policy(d["obs"]).log_prob(d["actions"])
        advantage = d["returns"] - torch.as_tensor(v)
        m = d["alive"].float()
        want = ((-logp * advantage) * m).sum() / m.sum()
    opt = torch.optim.Adam(agents.parameters(), lr=1e-3)
    out = MFAC["update"](agents, opt, rb, args, "cpu", np.random.default_rng(0))
    np.testing.assert_allclose(out["policy_loss"], want.item(), rtol=1e-5)
    np.testing.assert_allclose(out["advantage"], ((advantage.abs() * m).sum() / m.sum()).item(), rtol=1e-5)


def test_mfac_critic_v_trains_and_its_checkpoint_plays_the_greedy_actions_of_its_weights(tmp_path, capsys):
    from envs import make
    from runtime.checkpoint import read_checkpoint

    run_inline(capsys, "mfac", "--num-envs", 2, "--num-steps", 10, "--max-cycles", 7, "--total-timesteps", 40,
               "--eval-interval", 0, "--final-eval-episodes", 2, "--critic", "v", "--run-dir", tmp_path)  # fmt: skip
    ckpt = read_checkpoint(str(tmp_path / "last.pt"))
    assert ckpt["args"]["critic"] == "v"
    env = make("simple_spread_v3", 3, 0, backend="numba")
    group, spec = next(iter(env.groups.items()))
    obs = env.reset()
    actions = MFAC["actor"](ckpt, group, spec, torch.device("cpu"))(3, np.random.default_rng(0))(obs, None)[group]
    agents = MFAC["Agents"](spec, MFAC["Args"](critic="v"))
    agents.load_state_dict(MFAC["sub_state"](ckpt["nets"]["mfac"], f"agents.{group}."))
    want = agents.policy(torch.as_tensor(obs.obs[group])).probs.argmax(-1).numpy()
    np.testing.assert_array_equal(actions, want)
    assert agents.q(torch.as_tensor(obs.obs[group]), torch.zeros(3, spec.n_agents, spec.action_dim)).shape[-1] == 1
    # a checkpoint from before --critic (every mfac run until then) holds the Q critic, and still loads as one
    older = MFAC["MFAC"]({group: spec}, MFAC["Args"](critic="q"))
    args = {k: v for k, v in ckpt["args"].items() if k != "critic"}
    played = MFAC["actor"]({"args": args, "nets": {"mfac": older.state_dict()}}, group, spec, torch.device("cpu"))
    want = older.agents[group].policy(torch.as_tensor(obs.obs[group])).probs.argmax(-1).numpy()
    np.testing.assert_array_equal(played(3, np.random.default_rng(0))(obs, None)[group], want)
    env.close()
