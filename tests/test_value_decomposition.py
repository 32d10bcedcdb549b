"""algos/iql.py, vdn.py, qmix.py, wqmix.py, qtran.py and dcg.py: the mixers' and the coordination graph's properties,
masks and padding in the update, and each
script end to end with tiny budgets (in this process via `runpy`, as tests/test_maddpg.py does)."""

import copy
import json
import re
import runpy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import script_runs
import torch

from buffers import EpisodeReplayBuffer, team_fields
from envs.api import GroupSpec, Observation

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ["iql", "vdn", "qmix", "wqmix"]
TINY = ["--num-envs", "2", "--eval-episodes", "2", "--buffer-size", "50", "--batch-size", "4", "--learning-starts",
        "60", "--train-frequency", "10", "--final-eval-episodes", "4", "--log-interval", "20"]  # fmt: skip
SCRIPTED = "test_envs:make_scripted_env"  # action masks, a unit that dies mid-episode (tests/test_envs.py)


def script(algo):
    """The script's globals (its classes and functions), without running main."""
    return runpy.run_path(str(ROOT / "algos" / f"{algo}.py"), run_name=algo)


def run_inline(capsys, algo, *flags, check=True):
    return script_runs.run_inline(capsys, algo, *TINY, *flags, check=check)


# --- the mixers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["qmix", "wqmix"])
def test_qmix_mixer_is_monotonic_in_every_agent_utility(algo):
    torch.manual_seed(0)
    s = script(algo)
    mixer = s["Mixer"](4, 10, s["Args"]())
    qs = (10 * torch.randn(7, 16, 4)).requires_grad_()
    states = 3 * torch.randn(7, 16, 10)
    q_tot = mixer(qs, states)
    assert q_tot.shape == (7, 16)
    (grad,) = torch.autograd.grad(q_tot.sum(), qs)
    assert (grad >= 0).all() and (grad > 0).any()  # dQ_tot/dQ_a >= 0, and not trivially zero


def test_vdn_mixer_is_the_sum():
    qs = torch.randn(5, 3, 4)
    assert torch.equal(script("vdn")["VDN"].mixer(qs), qs.sum(-1))


def test_wqmix_weights_reduce_to_qmix_at_alpha_one_and_pick_the_right_steps():
    s = script("wqmix")
    g = torch.Generator().manual_seed(0)
    td, targets, greedy_q = (torch.randn(6, 8, generator=g) for _ in range(3))
    is_greedy = torch.rand(6, 8, generator=g) < 0.3
    for weighting in ("ow", "cw"):  # weight 1 everywhere: the weighted loss is QMIX's squared TD error
        args = SimpleNamespace(weighting=weighting, weighting_alpha=1.0)
        assert torch.equal(s["qmix_weights"](td, targets, greedy_q, is_greedy, args), torch.ones(6, 8))
    ow = s["qmix_weights"](td, targets, greedy_q, is_greedy, SimpleNamespace(weighting="ow", weighting_alpha=0.3))
    assert torch.equal(ow, torch.where(td < 0, 1.0, 0.3))  # Q_tot below the target: full weight
    cw = s["qmix_weights"](td, targets, greedy_q, is_greedy, SimpleNamespace(weighting="cw", weighting_alpha=0.3))
    assert torch.equal(cw, torch.where(is_greedy | (targets > greedy_q), 1.0, 0.3))
    assert (cw == 1).any() and (cw == 0.3).any() and (ow == 1).any() and (ow == 0.3).any()


# --- the update: padding, masks, targets ------------------------------------------------------------


SPECS = {
    "unit": GroupSpec("unit", ("u0", "u1", "u2"), (3,), np.float32, True, 4, has_action_mask=True),
    "scout": GroupSpec("scout", ("s0",), (2,), np.float32, True, 3),
}
STATE = (11,)


def learner(algo, **flags):
    """The script's networks (online, target with the same weights), an Adam at lr 0 and its Args."""
    s = script(algo)
    args = s["Args"](batch_size=3, buffer_size=10, **flags)
    torch.manual_seed(0)
    cls = {"iql": "IQL", "vdn": "VDN", "qmix": "QMIX", "wqmix": "WQMIX", "qtran": "QTRAN", "dcg": "DCG"}[algo]
    if algo == "dcg":
        net = s[cls](SPECS, args, max(spec.action_dim for spec in SPECS.values()))
    else:
        net = s[cls](SPECS, STATE[0], args) if algo in ("qmix", "wqmix", "qtran") else s[cls](SPECS, args)
    return s, net, copy.deepcopy(net), torch.optim.Adam(net.parameters(), lr=0.0), args


def filled_buffer(s, algo, lengths=(3, 7, 5), seed=0):
    """Episodes of the given lengths with random contents in every declared field, masks included."""
    state = STATE if algo in ("qmix", "wqmix", "qtran") else None
    fields = team_fields(SPECS, state, team_reward=algo != "iql")
    rb = EpisodeReplayBuffer(10, max(lengths), 1, fields)
    rng = np.random.default_rng(seed)

    def draw(name, n):
        shape, dtype = rb.schema.fields[name]
        if name.startswith("actions_"):
            return np.zeros((n, *shape), np.int64)  # replaced by an available action below
        if dtype == np.bool_:
            return rng.random((n, *shape)) < (0.7 if name.startswith(("agent_mask_", "avail_")) else 0.2)
        return rng.normal(size=(n, *shape)).astype(dtype)

    for length in lengths:
        for _ in range(length):
            step = {name: draw(name, 1) for name in rb.schema}
            for g, spec in SPECS.items():
                avail = step.get(f"avail_{g}", np.ones((1, spec.n_agents, spec.action_dim), bool))
                avail[..., 0] = True  # at least one available action
                step[f"actions_{g}"] = np.argmax(rng.random(avail.shape) * avail, -1)
            rb.add(**step)
        final = {n: draw(n, 1) for n in rb.schema if not n.startswith(("actions_", "reward", "terminated"))}
        for g in SPECS:
            if f"avail_{g}" in final:
                final[f"avail_{g}"][..., 0] = True
        rb.finish([0], **final)
    return rb


def loss_and_grads(s, net, target, opt, rb, args):
    beta = () if s["ALGO"] in ("qtran", "dcg") else (0.4,)  # qtran and dcg sample uniformly
    out = s["update"](net, target, opt, rb, args, "cpu", np.random.default_rng(1), *beta)
    return out, [p.grad.clone() for p in net.parameters()]


@pytest.mark.parametrize(
    "algo, flags",
    [(a, f) for a in ALGOS for f in ({}, {"seq_len": 3, "burn_in": 2}, {"td_lambda": 0.0, "n_step": 3})]
    + [(a, {"standardise_rewards": True}) for a in [*ALGOS, "qtran", "dcg"]]  # nor the statistics
    + [("qtran", {}), ("qtran", {"variant": "alt"}), ("dcg", {}), ("dcg", {"payoff_rank": 2, "graph": "cycle"})],
)
def test_padding_never_reaches_the_loss(algo, flags):
    s, net, target, opt, args = learner(algo, **flags)
    rb = filled_buffer(s, algo)
    before = copy.deepcopy(net.state_dict())  # lr 0 keeps the weights; --standardise-rewards' statistics move
    clean = loss_and_grads(s, net, target, opt, rb, args)
    net.load_state_dict(before)
    rng = np.random.default_rng(5)
    for slot, length in enumerate(rb.lengths[: len(rb)]):  # garbage in every row after the final observation
        for name, arr in rb.data.items():
            pad = arr[slot, length + 1 :]
            if name.startswith("actions_"):
                pad[...] = rng.integers(0, pad.shape[-1] if pad.ndim > 1 else 3, pad.shape) % 3
            elif arr.dtype == np.bool_:
                pad[...] = rng.random(pad.shape) < 0.5
            else:
                pad[...] = rng.normal(0, 1e3, pad.shape)
    dirty = loss_and_grads(s, net, target, opt, rb, args)
    assert clean[0] == pytest.approx(dirty[0], rel=1e-6)
    for a, b in zip(clean[1], dirty[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert clean[0]["td_loss"] > 0


@pytest.mark.parametrize(
    "algo, standardise", [("iql", False), ("qmix", False), *((a, True) for a in ("iql", "vdn", "qmix"))]
)
def test_one_step_targets_take_the_best_available_next_action(algo, standardise):
    """With --td-lambda 0 the loss equals the textbook one: y = r + gamma * (1 - terminated) * Q'(s', argmax over the
    available actions of Q(s', .)), with an unavailable action made the most valuable so that ignoring masks shows.
    With --standardise-rewards, r is (r - mean) / std over the batch's stored rewards (not padding, not the dead)."""
    s, net, target, opt, args = learner(algo, td_lambda=0.0, standardise_rewards=standardise)
    with torch.no_grad():  # action 1 of every unit: the largest utility, and masked out below in most steps
        for m in (net, target):
            for agent in m.agents["unit"].nets:
                agent.head.bias[1] += 100.0
    rb = filled_buffer(s, algo, lengths=(4, 6, 5), seed=3)
    rb.data["avail_unit"][..., 1] = False  # never available: a max that ignores the mask is off by ~100
    out = s["update"](net, target, opt, rb, args, "cpu", np.random.default_rng(1), 0.4)
    batch = rb.sample(3, np.random.default_rng(1))  # the batch the update drew
    b = {k: torch.as_tensor(v) for k, v in batch.items()}
    mask = b["loss_mask"][:-1].float()
    chosen, best = {}, {}
    with torch.no_grad():
        for g, agents in net.agents.items():
            q = agents(b[f"obs_{g}"].float())[0]
            chosen[g] = q[:-1].gather(-1, b[f"actions_{g}"][:-1, ..., None]).squeeze(-1)
            masked = q.masked_fill(~b[f"avail_{g}"], -torch.inf) if f"avail_{g}" in b else q
            best[g] = q[1:].gather(-1, masked[1:].argmax(-1, keepdim=True)).squeeze(-1)  # online == target here
            assert best[g][mask.bool()].max() < 50  # the masked-out action is never the max

        def rewards(r, stored):  # the targets' rewards: raw, or standardised over the stored ones
            return (r - r[stored].mean()) / r[stored].std(unbiased=False) if standardise else r

        if algo == "iql":
            sq, n = 0.0, 0.0
            for g in SPECS:
                alive = b[f"agent_mask_{g}"].float()
                r = rewards(b[f"rewards_{g}"], b["loss_mask"][..., None] & b[f"agent_mask_{g}"])
                y = r[:-1] + args.gamma * (~b[f"terminated_{g}"][:-1]).float() * best[g]
                m = mask[..., None] * alive[:-1]
                sq, n = sq + (m * (chosen[g] - y) ** 2).sum(), n + m.sum()
            expected = sq / n
        else:
            alive = {g: b[f"agent_mask_{g}"].float() for g in SPECS}
            qs = torch.cat([chosen[g] * alive[g][:-1] for g in SPECS], -1)
            nxt = torch.cat([best[g] * alive[g][1:] for g in SPECS], -1)
            q_tot = net.mixer(qs, b["state"][:-1]) if algo == "qmix" else qs.sum(-1)
            next_q_tot = target.mixer(nxt, b["state"][1:]) if algo == "qmix" else nxt.sum(-1)
            y = rewards(b["reward"], b["loss_mask"])[:-1] + args.gamma * (~b["terminated"][:-1]).float() * next_q_tot
            expected = (mask * (q_tot - y) ** 2).sum() / mask.sum()
    assert out["td_loss"] == pytest.approx(expected.item(), rel=1e-4 if standardise else 1e-5)
    if standardise:  # the statistics took the batch's stored rewards, once each
        norms = net.reward_norms.values() if algo == "iql" else [net.reward_norm]
        stored = (
            [b["loss_mask"][..., None] & b[f"agent_mask_{g}"] for g in SPECS] if algo == "iql" else [b["loss_mask"]]
        )
        assert [round(norm.count.item()) for norm in norms] == [int(m.sum()) for m in stored]


@pytest.mark.parametrize("algo", ALGOS)
def test_acting_respects_action_masks(algo):
    s, net, _, _, _ = learner(algo)
    with torch.no_grad():
        for agent in net.agents["unit"].nets:
            agent.head.bias[2] += 100.0  # the greedy choice, were it not masked out
    rng = np.random.default_rng(0)
    E = 64
    avail = rng.random((E, 3, 4)) < 0.5
    avail[..., 0] = True
    avail[..., 2] = False
    obs = Observation({"unit": rng.normal(size=(E, 3, 3)), "scout": rng.normal(size=(E, 1, 2))}, np.zeros((E, 11)),
                      {"unit": np.ones((E, 3), bool), "scout": np.ones((E, 1), bool)}, {"unit": avail})  # fmt: skip
    for epsilon in (0.0, 0.5, 1.0):
        hidden = {g: torch.zeros(1, E, spec.n_agents, 64) for g, spec in SPECS.items()}
        actions = s["act"](net.agents, SPECS, obs, hidden, epsilon, rng, "cpu")
        assert np.take_along_axis(avail, actions["unit"][..., None], -1).all()
        assert actions["scout"].max() < 3 and hidden["unit"].abs().sum() > 0


# --- the scripts end to end -------------------------------------------------------------------------


@pytest.mark.parametrize("algo", [*ALGOS, "qtran", "dcg"])
def test_spread_writes_events_checkpoints_and_reloads_to_the_same_greedy_actions(algo, tmp_path, capsys):
    run_inline(capsys, algo, "--total-timesteps", 200, "--eval-interval", 100, "--run-dir", tmp_path)
    for name in ("config.json", "last.pt", "best.pt", "final_eval.json", "DONE"):
        assert (tmp_path / name).exists(), name
    assert len(script_runs.scalars(tmp_path, "eval/episodic_return")) == 2
    for tag in ("losses/td_loss", "losses/q_values", "charts/epsilon", "charts/episodic_return"):
        assert script_runs.scalars(tmp_path, tag), tag
    ckpt = torch.load(tmp_path / "last.pt", weights_only=True)
    assert ckpt["global_step"] == 200 and ckpt["algo"] == algo
    # greedy evaluation of the reloaded checkpoint replays the first episodes of the run's final evaluation exactly
    _, stdout, _ = run_inline(capsys, algo, "--eval-checkpoint", tmp_path / "last.pt")
    reloaded = float(re.search(r"episodic return (-?[\d.]+)", stdout).group(1))
    final = json.loads((tmp_path / "final_eval.json").read_text())["returns"][:2]
    assert reloaded == pytest.approx(float(np.mean(final)), abs=0.01)


@pytest.mark.parametrize("algo", [*ALGOS, "qtran", "dcg"])
def test_standardised_rewards_statistics_are_checkpointed_and_a_contrary_flag_is_refused(algo, tmp_path, capsys):
    """--standardise-rewards: the run's last.pt holds the statistics of the rewards it replayed (every stored one
    counted, so more than the batch of the first update); --eval-checkpoint takes the flag from the checkpoint and
    replays the final evaluation; --no-standardise-rewards is refused with the flag named (the networks hold
    statistics a plain run has not)."""
    run_inline(
        capsys, algo, "--standardise-rewards", "--total-timesteps", 200, "--eval-interval", 0, "--run-dir", tmp_path
    )
    nets = torch.load(tmp_path / "last.pt", weights_only=True)["nets"][algo]
    counts = [v.item() for k, v in nets.items() if k.startswith("reward_norm") and k.endswith("count")]
    assert counts and all(c > 4 for c in counts)  # at least one batch of 4 episodes of stored steps
    assert all(torch.isfinite(v).all() and v.item() > 0 for k, v in nets.items() if k.endswith("var"))
    _, stdout, _ = run_inline(capsys, algo, "--eval-checkpoint", tmp_path / "last.pt")
    final = json.loads((tmp_path / "final_eval.json").read_text())["returns"][:2]
    assert float(re.search(r"episodic return (-?[\d.]+)", stdout).group(1)) == pytest.approx(np.mean(final), abs=0.01)
    code, _, stderr = run_inline(
        capsys, algo, "--no-standardise-rewards", "--eval-checkpoint", tmp_path / "last.pt", check=False
    )
    assert code != 0 and "--standardise-rewards True (checkpoint) vs False (now)" in stderr


@pytest.mark.parametrize("algo", [*ALGOS, "qtran", "dcg"])
def test_same_seed_same_first_losses_and_another_seed_differs(algo, tmp_path, capsys):
    common = ["--total-timesteps", 120, "--eval-episodes", 1]
    for name, seed, every in (("a", 3, 0), ("b", 3, 50), ("c", 4, 0)):  # an evaluation in between changes nothing
        run_inline(capsys, algo, *common, "--seed", seed, "--eval-interval", every, "--run-dir", tmp_path / name)
    a, b, c = (script_runs.scalars(tmp_path / name, "losses/td_loss") for name in "abc")
    assert a and a == b and a != c


@pytest.mark.parametrize(
    "algo, flags",
    [
        ("iql", ["--prioritized", "--no-share-params"]),
        ("vdn", ["--seq-len", 3, "--burn-in", 1]),
        ("qmix", ["--prioritized", "--td-lambda", 0, "--n-step", 2]),
        ("wqmix", ["--weighting", "cw", "--no-share-params", "--tau", 0.05]),
        ("dcg", ["--graph", "line", "--payoff-rank", 1, "--no-share-params"]),
        ("qtran", ["--variant", "alt"]),
    ],
)
def test_masks_dead_agents_and_variants_on_a_scripted_env(algo, flags, tmp_path, capsys):
    """The scripted env fails on a masked-out action, and its unit_2 dies mid-episode."""
    run_inline(capsys, algo, "--env", SCRIPTED, "--total-timesteps", 200, "--eval-interval", 0, "--learning-starts",
               30, "--run-dir", tmp_path, *flags)  # fmt: skip
    assert (tmp_path / "DONE").exists() and script_runs.scalars(tmp_path, "losses/td_loss")


def test_a_group_frozen_to_random_actions_on_a_competitive_env(tmp_path, capsys):
    flags = ["--env", "simple_adversary_v3", "--random-groups", "adversary", "--total-timesteps", 150]
    run_inline(capsys, "qmix", *flags, "--eval-interval", 0, "--run-dir", tmp_path)
    nets = torch.load(tmp_path / "last.pt", weights_only=True)["nets"]["qmix"]
    assert {k.split(".")[1] for k in nets if k.startswith("agents.")} == {"agent"}


@pytest.mark.parametrize(
    "algo, flags, message",
    [
        ("qmix", ["--continuous-actions"], "qmix needs discrete actions"),
        ("iql", ["--env", "simple_spread_v3", "--continuous-actions"], "use mappo.py, ippo.py, maddpg.py"),
        ("vdn", ["--n-step", 3], "--n-step 3 and --td-lambda 0.6 are two kinds of target"),
        ("qmix", ["--batch-size", 64], "--batch-size 64 exceeds --buffer-size 50"),
        ("wqmix", ["--weighting-alpha", 1.5], "--weighting-alpha 1.5 must lie in [0, 1]"),
        ("vdn", ["--random-groups", "agent"], "nothing would learn"),
        ("qmix", ["--env", "simple_adversary_v3"], "are rewarded differently, so they compete"),
        ("qtran", ["--opt-loss", -1], "--opt-loss and --nopt-loss must be >= 0"),
        ("dcg", ["--payoff-rank", -1], "--payoff-rank must be >= 0"),
    ],
)
def test_bad_input_fails_with_one_clear_error(algo, flags, message, capsys):
    code, _, stderr = run_inline(capsys, algo, *flags, check=False)
    assert code == 2 and "Traceback" not in stderr
    line = stderr.strip().splitlines()[-1]  # a fault found while running follows the progress bar
    assert line.startswith("error:") and message.lower() in line.lower(), stderr


def test_qtran_alt_counterfactual_values_leave_out_the_agents_own_action_and_the_dead():
    """QTRAN-alt's Q_jt(s, ., u_-i): agent i's row of values does not move with its own action, moves with another
    living agent's, and not with a dead agent's; read at the taken actions, it is the mean of the living agents'."""
    s, net, _, _, args = learner("qtran", variant="alt")
    g = torch.Generator().manual_seed(0)
    features, state = torch.randn(2, 5, 4, args.hidden_size, generator=g), torch.randn(2, 5, STATE[0], generator=g)
    alive = torch.ones(2, 5, 4)
    alive[:, :, 3] = 0.0  # the scout is dead
    u = torch.randint(0, 3, (2, 5, 4), generator=g)

    def rows(u):
        return net.joint(features, torch.nn.functional.one_hot(u, 4).float(), alive, state)[0]

    base = rows(u)
    assert base.shape == (2, 5, 4, 4)
    for i, j in ((0, 1), (2, 0), (1, 2)):
        moved = u.clone()
        moved[..., i] = (u[..., i] + 1) % 3
        other = rows(moved)
        torch.testing.assert_close(other[..., i, :], base[..., i, :])  # its own action is left out
        assert not torch.allclose(other[..., j, :], base[..., j, :])  # the others see it
    dead = u.clone()
    dead[..., 3] = (u[..., 3] + 1) % 3
    torch.testing.assert_close(rows(dead)[..., :3, :], base[..., :3, :])  # a dead agent's action reaches nobody
    taken = base.gather(-1, u[..., None]).squeeze(-1)[..., :3].mean(-1)
    torch.testing.assert_close(s["joint_value"](base, u, alive), taken)


# --- QTRAN's point: the non-monotonic matrix game ---------------------------------------------------------------

# 1000 updates on uniformly explored one-step episodes (results/matrix_qtran: 2500, 20k steps trained every 8)
MATRIX = ["--env", "matrix_qtran", "--num-envs", 8, "--total-timesteps", 16000, "--eval-interval", 0,
          "--final-eval-episodes", 8, "--learning-starts", 500, "--train-frequency", 16,
          "--target-network-frequency", 400, "--end-e", 1.0]  # fmt: skip


def test_qtran_and_dcg_find_the_optimum_of_the_non_monotonic_game_that_vdn_cannot_represent(tmp_path, capsys):
    """Son et al. 2019, Table 1: from uniformly explored data, QTRAN's greedy joint action is the 8 surrounded by -12,
    and so is DCG's, whose payoff matrix on the one edge can hold any 3 x 3 table (Böhmer et al. 2020); VDN's sum of
    utilities cannot express that payoff and settles on a 0 (results/matrix_qtran has the seeds)."""
    finals = {}
    for algo in ("qtran", "dcg", "vdn"):
        script_runs.run_inline(capsys, algo, *MATRIX, "--seed", 2, "--batch-size", 32, "--buffer-size", 5000,
                               "--run-dir", tmp_path / algo)  # fmt: skip
        finals[algo] = json.loads((tmp_path / algo / "final_eval.json").read_text())["mean"]
    assert finals == {"qtran": 8.0, "dcg": 8.0, "vdn": 0.0}


def test_qtran_alt_finds_the_optimum_on_a_seed_where_base_settles_on_zero(tmp_path, capsys):
    """L_nopt-min holds Q' above Q_jt - V at every agent's every action, not only at the taken joint action: on the
    non-monotonic game alt reaches 8 on seed 0, where base's greedy joint action pays 0 (results/matrix_qtran: alt 5
    of 5 seeds, base 3 of 5)."""
    script_runs.run_inline(capsys, "qtran", *MATRIX, "--seed", 0, "--batch-size", 32, "--buffer-size", 5000,
                           "--variant", "alt", "--run-dir", tmp_path)  # fmt: skip
    assert json.loads((tmp_path / "final_eval.json").read_text())["mean"] == 8.0


# --- DCG's coordination graph ------------------------------------------------------------------------------------


def coordination_graph(graph, n_agents=4, n_actions=3, rank=0, hidden=5):
    s = script("dcg")
    spec = GroupSpec("team", tuple(f"a{i}" for i in range(n_agents)), (2,), np.float32, True, n_actions)
    args = s["Args"](graph=graph, payoff_rank=rank, hidden_size=hidden)
    torch.manual_seed(0)
    return s["DCG"]({"team": spec}, args, n_actions)


def brute_force(dcg, f_i, f_ij, avail, alive):
    """Every joint action's Q, the best available one per batch row: (B, N)."""
    B, N, n = f_i.shape
    joint = torch.cartesian_prod(*[torch.arange(n)] * N)  # (n^N, N)
    J = len(joint)
    q = dcg.q_value(
        f_i[:, None].expand(B, J, N, n),
        f_ij[:, None].expand(B, J, *f_ij.shape[1:]),
        joint.expand(B, J, N),
        alive[:, None].expand(B, J, N),
    )  # (B, n^N)
    allowed = avail[:, None].expand(B, J, N, n).gather(-1, joint.expand(B, J, N)[..., None]).squeeze(-1).all(-1)
    return joint[q.masked_fill(~allowed, -torch.inf).argmax(-1)]


@pytest.mark.parametrize("graph", ["line", "star", "none"])
def test_max_sum_equals_the_brute_force_argmax_on_a_graph_without_cycles(graph):
    """On a tree, max-sum is exact (Kok and Vlassis 2006): the greedy joint action is the best of all n^N, with
    unavailable actions never chosen and a dead agent's terms out of the value."""
    dcg = coordination_graph(graph)
    g = torch.Generator().manual_seed(1)
    f_i = torch.randn(200, 4, 3, generator=g)
    f_ij = 3 * torch.randn(200, len(dcg.edges_from), 3, 3, generator=g)
    avail = torch.rand(200, 4, 3, generator=g) < 0.7
    avail[..., 0] = True
    alive = (torch.rand(200, 4, generator=g) < 0.9).float()
    greedy = script("dcg")["max_sum"](dcg, f_i, f_ij, avail, alive, iterations=8)
    expected = brute_force(dcg, f_i, f_ij, avail, alive)
    q, best = dcg.q_value(f_i, f_ij, greedy, alive), dcg.q_value(f_i, f_ij, expected, alive)
    torch.testing.assert_close(q, best)  # ties between joint actions of equal value may pick either
    assert avail.gather(-1, greedy[..., None]).all()


def test_max_sum_on_the_full_graph_is_exact_for_two_agents_and_close_for_four():
    """Dense graphs have cycles, where max-sum is an approximation: the anytime extension keeps its best joint
    action, which is never worth more than the true optimum and is the optimum on most random payoffs."""
    for n_agents, share in ((2, 1.0), (4, 0.8)):
        dcg = coordination_graph("full", n_agents)
        g = torch.Generator().manual_seed(2)
        f_i, f_ij = torch.randn(300, n_agents, 3, generator=g), torch.randn(300, len(dcg.edges_from), 3, 3, generator=g)
        avail, alive = torch.ones(300, n_agents, 3, dtype=torch.bool), torch.ones(300, n_agents)
        q = dcg.q_value(f_i, f_ij, script("dcg")["max_sum"](dcg, f_i, f_ij, avail, alive, iterations=8), alive)
        best = dcg.q_value(f_i, f_ij, brute_force(dcg, f_i, f_ij, avail, alive), alive)
        assert (q <= best + 1e-6).all() and (q >= best - 1e-6).float().mean() >= share


def test_payoffs_are_symmetric_in_an_edges_ends_and_low_rank_when_asked():
    """f_ij(u_i, u_j) computed from [h_i, h_j] is f_ji(u_j, u_i) from [h_j, h_i]: the payoff of an edge does not
    depend on which end the graph lists first; with --payoff-rank K each matrix has rank at most 2K."""
    dcg = coordination_graph("full", rank=0)
    h = torch.randn(6, 4, 5)
    f_ij = dcg.payoffs(h)
    swapped = dcg.payoffs(h[:, [1, 0, 2, 3]])  # agents 0 and 1 trade places: edge (0, 1) is read from the other end
    torch.testing.assert_close(swapped[:, 0], f_ij[:, 0].transpose(-1, -2))
    low = coordination_graph("full", n_actions=6, rank=1)
    assert torch.linalg.matrix_rank(low.payoffs(torch.randn(6, 4, 5))).max() <= 2


def test_independent_learners_overgeneralize_on_the_climbing_game_and_dcg_does_not(tmp_path, capsys):
    """Claus and Boutilier 1998: against an exploring partner, the optimum's actions (11, beside -30s) look worst, and
    independent learners settle on the safe corner worth 5; DCG's payoff matrix holds the table and finds the 11
    (results/matrix_climbing has 5 seeds of five scripts)."""
    finals = {}
    for algo in ("iql", "dcg"):
        flags = [*MATRIX, "--env", "matrix_climbing", "--seed", 0, "--batch-size", 32, "--buffer-size", 5000]
        script_runs.run_inline(capsys, algo, *flags, "--run-dir", tmp_path / algo)
        finals[algo] = json.loads((tmp_path / algo / "final_eval.json").read_text())["mean"]
    assert finals == {"iql": 5.0, "dcg": 11.0}
