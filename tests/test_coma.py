"""algos/coma.py: the counterfactual baseline against a per-agent loop, the critic's TD(lambda) targets against
buffers/reference.py, and the script end to end with tiny budgets (in this process via `runpy`)."""

import json
import re
import runpy
from pathlib import Path

import numpy as np
import pytest
import script_runs
import torch

from buffers import RolloutBuffer, reference
from envs.api import GroupSpec

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "algos" / "coma.py"
TINY = ["--num-envs", "2", "--num-steps", "10", "--eval-episodes", "2", "--final-eval-episodes", "4",
        "--target-network-frequency", "40"]  # fmt: skip
SCRIPTED = "test_envs:make_scripted_env"  # action masks, a unit that dies mid-episode (tests/test_envs.py)
SPEC = GroupSpec("unit", ("u0", "u1", "u2"), (4,), np.float32, True, 5)


@pytest.fixture(scope="module")
def coma():
    return runpy.run_path(str(SCRIPT), run_name="coma")


def run_inline(capsys, *flags, check=True):
    return script_runs.run_inline(capsys, "coma", *TINY, *flags, check=check)


@pytest.mark.parametrize("last_actions", [False, True])
def test_counterfactual_baseline_equals_a_per_agent_loop(coma, last_actions):
    torch.manual_seed(0)
    args = coma["Args"](critic_last_actions=last_actions)
    critic = coma["Critic"](SPEC, 7, args)
    B, A, n = 16, 3, 5
    state, obs = torch.randn(B, 7), torch.randn(B, A, 4)
    actions, alive, last = torch.randint(n, (B, A)), (torch.rand(B, A) < 0.8).float(), torch.randint(n + 1, (B, A))
    pi = torch.softmax(torch.randn(B, A, n), -1)
    with torch.no_grad():
        batched = coma["counterfactual_advantages"](critic(state, obs, actions, alive, last), pi, actions)
        expected = torch.zeros(B, A)
        for a in range(A):  # the textbook form: replace agent a's action by each alternative, one critic call each
            q = torch.zeros(B, n)
            for alt in range(n):
                joint = actions.clone()
                joint[:, a] = alt
                q[:, alt] = critic(state, obs, joint, alive, last)[:, a, alt]
            expected[:, a] = q.gather(1, actions[:, a : a + 1]).squeeze(1) - (pi[:, a] * q).sum(-1)
    torch.testing.assert_close(batched, expected, rtol=1e-5, atol=1e-5)
    assert batched.abs().max() > 1e-3  # not vacuous


def test_rnn_actor_logits_in_one_call_equal_the_step_by_step_cell(coma):
    """--rnn: the rollout's recurrence in one call (runtime/gru.py) equals nn.GRUCell step by step, restarting
    where episodes began, in the logits and in every gradient."""
    torch.manual_seed(0)
    args = coma["Args"](rnn=True, hidden_size=16)
    group = coma["Coma"](SPEC, 7, args)
    T, E = 9, 4
    mb = {"obs": torch.randn(T, E, 3, 4), "h_actor": torch.randn(T, E, 3, 16),
          "starts": (torch.rand(T, E) < 0.3).float()}  # fmt: skip
    results = []
    for fast in (True, False):
        group.zero_grad()
        if fast:
            logits = coma["actor_logits"](group, mb, args)
        else:
            out, hx = [], mb["h_actor"][0]
            for i in range(T):
                o, hx = group.actor(mb["obs"][i], hx * (1 - mb["starts"][i]).view(-1, 1, 1))
                out.append(o)
            logits = torch.stack(out)
        logits.sin().sum().backward()
        results.append([logits.detach(), *(p.grad.clone() for p in group.actor.parameters())])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def random_rollout(coma, args, terminated, truncated, rng):
    """A rollout of T x E steps of SPEC's 3 agents (state 7, 5 actions) with random contents, and `after`, the step
    that follows its last."""
    (T, E, A), n = terminated.shape, 5
    rb = RolloutBuffer(T, E, coma["rollout_fields"](SPEC, (7,), args))
    for i in range(T):
        rb.add(obs=rng.normal(size=(E, A, 4)), state=rng.normal(size=(E, 7)), actions=rng.integers(n, size=(E, A)),
               last_actions=rng.integers(n + 1, size=(E, A)), rewards=rng.normal(size=(E, A)),
               terminated=terminated[i], truncated=truncated[i], agent_mask=rng.random((E, A)) < 0.9,
               final_obs=rng.normal(size=(E, A, 4)), final_state=rng.normal(size=(E, 7)),
               final_actions=rng.integers(n, size=(E, A)), final_mask=np.ones((E, A), bool),
               values=np.zeros((E, A)), final_values=np.zeros((E, A)))  # fmt: skip
    after = {"state": rng.normal(size=(E, 7)), "obs": rng.normal(size=(E, A, 4)), "alive": np.ones((E, A), bool),
             "actions": rng.integers(n, size=(E, A)), "last_actions": rng.integers(n, size=(E, A))}  # fmt: skip
    return rb, after


def test_critic_targets_equal_the_reference_td_lambda_with_terminations_and_truncations(coma):
    torch.manual_seed(1)
    args = coma["Args"](gamma=0.9, td_lambda=0.7, critic_last_actions=True)  # every input matters
    group = coma["Coma"](SPEC, 7, args)
    T, E, A = 9, 4, 3
    rng = np.random.default_rng(2)
    truncated = np.zeros((T, E), bool)
    truncated[4, 0] = truncated[T - 1, 1] = truncated[2, 3] = True  # mid-rollout and at the last step
    terminated = rng.random((T, E, A)) < 0.1  # some agents die
    rb, after = random_rollout(coma, args, terminated, truncated, rng)
    returns = coma["critic_targets"](group, rb, after, args, "cpu").numpy()

    def q_target(state, obs, actions, alive, last):  # Q'(s, u) of the taken joint action, (E, A)
        f = lambda x, dt=torch.float32: torch.as_tensor(np.asarray(x), dtype=dt)  # noqa: E731
        with torch.no_grad():
            q = group.target_critic(f(state), f(obs), f(actions, torch.int64), f(alive), f(last, torch.int64))
        return q.gather(-1, f(actions, torch.int64)[..., None]).squeeze(-1).numpy()

    d = rb.data
    next_values = np.zeros((T, E, A), np.float32)
    for i in range(T):
        if i + 1 < T:
            nxt = q_target(d["state"][i + 1], d["obs"][i + 1], d["actions"][i + 1], d["agent_mask"][i + 1],
                           d["last_actions"][i + 1])  # fmt: skip
        else:
            nxt = q_target(after["state"], after["obs"], after["actions"], after["alive"], after["last_actions"])
        final = q_target(d["final_state"][i], d["final_obs"][i], d["final_actions"][i], d["final_mask"][i],
                         d["actions"][i])  # fmt: skip
        ends = terminated[i] | truncated[i][:, None]
        next_values[i] = np.where(ends, final, nxt)
    ends = terminated | truncated[..., None]
    expected = reference.td_lambda(d["rewards"].reshape(T, -1), next_values.reshape(T, -1), terminated.reshape(T, -1),
                                   ends.reshape(T, -1), 0.9, 0.7).reshape(T, E, A)  # fmt: skip
    np.testing.assert_allclose(returns, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ent_coef", [0.0, 0.05])
def test_the_entropy_bonus_alone_moves_the_actors_where_every_advantage_is_zero(coma, ent_coef):
    """A critic that values every action alike gives zero counterfactual advantages: the actors' step leaves them
    as they were without --ent-coef, and with it raises the policy's entropy (the only gradient left)."""
    torch.manual_seed(3)
    args = coma["Args"](ent_coef=ent_coef)
    group = coma["Coma"](SPEC, 7, args)
    with torch.no_grad():
        for p in [*group.critic.parameters(), *group.target_critic.parameters()]:
            p.zero_()  # Q = 0 for every joint action, and it stays so: the critic's learning rate is 0
        group.actor.head.weight.mul_(20)  # a peaked policy, far from uniform
    T, E, A = 6, 4, 3
    rng = np.random.default_rng(4)
    rb, after = random_rollout(coma, args, np.zeros((T, E, A), bool), np.zeros((T, E), bool), rng)
    actor_opt = torch.optim.Adam(group.actor.parameters(), lr=1e-2)
    critic_opt = torch.optim.Adam(group.critic.parameters(), lr=0.0)
    before = [p.clone() for p in group.actor.parameters()]
    first = coma["update"](group, actor_opt, critic_opt, rb, after, 0.01, args, "cpu")
    assert first["advantage"] == 0.0 and first["policy_loss"] == 0.0
    second = coma["update"](group, actor_opt, critic_opt, rb, after, 0.01, args, "cpu")
    moved = [not torch.equal(a, b) for a, b in zip(before, group.actor.parameters(), strict=True)]
    if ent_coef == 0:
        assert not any(moved) and second["entropy"] == pytest.approx(first["entropy"], abs=1e-6)
    else:
        assert all(moved) and second["entropy"] > first["entropy"] + 1e-3


@pytest.mark.parametrize("scale", [1.0, 1e-5])
def test_actor_adam_eps_makes_small_advantages_take_small_steps(coma, scale):
    """Adam divides the step by the gradient's own size: at the default epsilon (1e-8) advantages 1e-5 times smaller
    move the actors as far as full-size ones; with --actor-adam-eps 1e-3 they barely move them, where full-size
    advantages still move them about as far as at the default."""
    moves = {}
    for eps in (1e-8, 1e-3):
        torch.manual_seed(5)
        args = coma["Args"](actor_adam_eps=eps, critic_lr=1e-12)  # the critic stays as it is
        group = coma["Coma"](SPEC, 7, args)
        with torch.no_grad():
            group.critic.net[-1].weight.mul_(scale)  # Q and so the advantages scaled by `scale`
            group.critic.net[-1].bias.mul_(scale)
        rb, after = random_rollout(
            coma, args, np.zeros((6, 4, 3), bool), np.zeros((6, 4), bool), np.random.default_rng(4)
        )
        opts = coma["make_optimizers"]({"unit": group}, ["unit"], args)
        assert opts["unit_actor"].defaults["eps"] == eps and opts["unit_critic"].defaults["eps"] == 1e-8
        before = torch.cat([p.detach().flatten().clone() for p in group.actor.parameters()])
        coma["update"](group, opts["unit_actor"], opts["unit_critic"], rb, after, 0.01, args, "cpu")
        after_step = torch.cat([p.detach().flatten() for p in group.actor.parameters()])
        moves[eps] = (after_step - before).abs().max().item()
    assert moves[1e-8] > 0.8 * 5e-4  # about lr x sign(gradient) on Adam's first step, whatever the scale
    if scale == 1.0:
        assert moves[1e-3] > 0.5 * moves[1e-8]
    else:
        assert moves[1e-3] < 0.01 * moves[1e-8]


def test_policy_probs_keep_the_epsilon_floor_on_available_actions_only(coma):
    logits = torch.tensor([[[5.0, 0.0, 0.0, -3.0]]])
    avail = torch.tensor([[[True, False, True, True]]])
    pi = coma["policy_probs"](logits, avail, 0.3)
    assert pi[..., 1] == 0 and torch.allclose(pi.sum(-1), torch.ones(1, 1))
    assert pi[..., 3] >= 0.1 - 1e-6  # at least epsilon / 3 available actions


def test_spread_writes_events_checkpoints_and_reloads_to_the_same_greedy_actions(tmp_path, capsys):
    run_inline(capsys, "--total-timesteps", 200, "--eval-interval", 100, "--run-dir", tmp_path)
    for name in ("config.json", "last.pt", "best.pt", "final_eval.json", "DONE"):
        assert (tmp_path / name).exists(), name
    for tag in ("losses/policy_loss", "losses/qf_loss", "losses/q_values", "charts/epsilon"):
        assert script_runs.scalars(tmp_path, tag), tag
    _, stdout, _ = run_inline(capsys, "--eval-checkpoint", tmp_path / "last.pt")
    reloaded = float(re.search(r"episodic return (-?[\d.]+)", stdout).group(1))
    final = json.loads((tmp_path / "final_eval.json").read_text())["returns"][:2]
    assert reloaded == pytest.approx(float(np.mean(final)), abs=0.01)


def test_same_seed_same_first_losses_and_another_seed_differs(tmp_path, capsys):
    for name, seed, every in (("a", 3, 0), ("b", 3, 40), ("c", 4, 0)):  # an evaluation in between changes nothing
        run_inline(capsys, "--total-timesteps", 80, "--eval-episodes", 1, "--seed", seed, "--eval-interval", every,
                   "--run-dir", tmp_path / name)  # fmt: skip
    for tag in ("losses/policy_loss", "losses/qf_loss"):
        a, b, c = (script_runs.scalars(tmp_path / name, tag) for name in "abc")
        assert a and a == b and a != c, tag


@pytest.mark.parametrize("flags", [["--rnn", "--critic-last-actions"], []])
def test_masks_and_a_dying_unit_on_a_scripted_env(flags, tmp_path, capsys):
    """The scripted env fails on a masked-out action, and its unit_2 dies mid-episode."""
    run_inline(capsys, "--env", SCRIPTED, "--total-timesteps", 120, "--eval-interval", 0, "--run-dir", tmp_path, *flags)
    assert (tmp_path / "DONE").exists() and script_runs.scalars(tmp_path, "losses/qf_loss")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--continuous-actions"], "coma needs discrete actions"),
        (["--critic-updates", 0], "--critic-updates 0 must be a positive integer"),
        (["--td-lambda", 2], "--td-lambda 2.0 must lie in [0, 1]"),
        (["--ent-coef", -1], "--ent-coef -1.0 must be >= 0"),
        (["--actor-adam-eps", 0], "--actor-adam-eps 0.0 must be > 0"),
    ],
)
def test_bad_input_fails_with_one_clear_error(flags, message, capsys):
    code, _, stderr = run_inline(capsys, *flags, check=False)
    assert code == 2 and "Traceback" not in stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("error:") and message.lower() in line.lower(), stderr
