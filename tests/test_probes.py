"""probes/: the small studies behind the notes of results/ (what a team's messages carry, screens of a script's
variants, the scripted ceiling of simple_v3)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "probes"))

import script_runs  # noqa: E402


@pytest.mark.parametrize("env_id", ["simple_reference_v3", "simple_speaker_listener_v4"])
def test_comm_probe_tells_a_communicating_team_from_a_random_one(env_id):
    import comm_probe

    env = comm_probe.make(env_id, num_envs=1, seed=0, backend="numba")
    specs = dict(env.groups)
    env.close()
    rand = comm_probe.probe(*comm_probe.actors_of("random", env_id, specs, 300), 300)
    talk = comm_probe.probe(*comm_probe.actors_of("scripted", env_id, specs, 300), 300)
    assert abs(rand["reach"] - 1 / 3) < 0.07 and rand["symbol_bits"] < 0.01
    assert talk["reach"] > 0.85 and talk["symbol_bits"] > 1.55 and talk["dist_target"] < talk["dist_other"] / 3
    assert talk["return"] > rand["return"] + 10
    assert len({symbol for symbol, _ in talk["code"]}) == 3 and min(share for _, share in talk["code"]) > 0.9
    assert comm_probe.code(np.zeros(6, int), np.arange(6) % 3, 10) == [[0, 1.0]] * 3  # one symbol for every colour
    x = np.repeat(np.arange(3), 100)  # a symbol that is the colour: log2(3) bits; one that ignores it: 0
    assert comm_probe.mutual_information_bits(x, x, 10, 3) == pytest.approx(np.log2(3))
    assert comm_probe.mutual_information_bits(np.zeros_like(x), x, 10, 3) == 0.0


def test_comm_probe_reads_a_checkpoints_every_group(tmp_path, capsys):
    """A speaker_listener checkpoint (two groups, continuous actions) plays through the probe's command, on the
    final evaluation's episodes: its return is the run's own final-policy number."""
    import comm_probe

    script_runs.run_inline(capsys, "maddpg", "--env-id", "simple_speaker_listener_v4", "--num-envs", "2",
                           "--total-timesteps", 200, "--learning-starts", 100, "--eval-interval", 0,
                           "--final-eval-episodes", 20, "--run-dir", tmp_path)  # fmt: skip
    comm_probe.main([str(tmp_path / "last.pt"), "--env-id", "simple_speaker_listener_v4", "--episodes", "20",
                     "--out", str(tmp_path / "probe.json")])  # fmt: skip
    rows = json.loads((tmp_path / "probe.json").read_text())
    assert [r["algo"] for r in rows] == ["random", "scripted", "maddpg"]
    assert 0 <= rows[2]["reach"] <= 1 and rows[2]["symbol_bits"] >= 0 and rows[2]["episodes"] == 20
    final = json.loads((tmp_path / "final_eval.json").read_text())["returns"]
    assert rows[2]["return"] == pytest.approx(float(np.mean(final)), abs=1e-4)


def test_comm_screens_given_speaker_sends_the_colour_each_agent_sees_and_keeps_its_moves():
    import comm_screens

    from envs import make

    env = comm_screens.GivenSpeaker(make("simple_reference_v3", num_envs=4, seed=3, backend="numba"))
    obs = env.reset()
    seen = np.argmax(obs.obs["agent"][..., 8:11], -1)  # (E, 2)
    step = env.step({"agent": np.full((4, 2), 4 + 5 * 7)})  # move +y, symbol 7: the symbol is replaced
    heard = step.next.obs["agent"][..., 11:21]  # each agent hears its partner's symbol
    assert (np.argmax(heard, -1) == seen[:, ::-1]).all() and (heard.max(-1) == 1).all()
    assert (step.next.obs["agent"][..., 1] > 0).all()  # the move stayed the policy's: velocity +y
    env.close()


def test_comm_screens_factored_heads_are_a_product_of_a_move_and_a_symbol_distribution():
    import comm_screens
    import torch
    from torch.distributions import Categorical

    out = torch.randn(4, 2, 50)
    joint = comm_screens.factored(out).probs.view(4, 2, 10, 5)  # index symbol * 5 + move
    move, symbol = out[..., :5].softmax(-1), out[..., 5:15].softmax(-1)
    torch.testing.assert_close(joint, symbol.unsqueeze(-1) * move.unsqueeze(-2))
    entropy = comm_screens.factored(out).entropy()
    torch.testing.assert_close(entropy, Categorical(probs=move).entropy() + Categorical(probs=symbol).entropy())


def test_mpe_ceiling_controllers_walk_to_the_landmark_in_both_action_spaces():
    import mpe_ceiling

    for continuous in (False, True):
        still = mpe_ceiling.play(0, 0, continuous, episodes=50)  # no force: the agent stays where it starts
        walking = mpe_ceiling.play(8, 2, continuous, episodes=50)
        assert walking > still / 2, (continuous, walking, still)
    obs = np.array([[[0.0, 0.0, 0.3, -1.0]]], np.float32)  # landmark mostly below: push -y, or -y and some +x
    assert mpe_ceiling.controller(obs, 8, 2, continuous=False).tolist() == [[3]]
    np.testing.assert_allclose(mpe_ceiling.controller(obs, 8, 2, continuous=True)[0, 0], [0, 0, 1, 1, 0])


def test_spread_levels_scripted_controller_goes_to_its_own_landmark_and_beats_standing_still(tmp_path):
    import spread_levels

    # two agents at rest at (0, 0) and (1, 0); landmarks at (1, 0.5) and (0, -0.5): agent 0's nearest landmark is the
    # second, and the assignment sends agent 1 up (+y, action 4) and agent 0 down (-y, action 3)
    pos, marks = np.array([[0.0, 0.0], [1.0, 0.0]]), np.array([[1.0, 0.5], [0.0, -0.5]])
    obs = np.zeros((1, 2, 12))
    for i in range(2):
        obs[0, i, 2:4] = pos[i]
        obs[0, i, 4:8] = (marks - pos[i]).ravel()
    assert spread_levels.scripted_actions(obs).tolist() == [[3, 4]]
    obs[0, 0, 0:2] = [0.0, -3.0]  # moving fast toward its landmark already: it stops pushing (no-op), not overshoot
    assert spread_levels.scripted_actions(obs)[0, 0] in (0, 4)
    # without the assignment both agents head for (0.5, 0.1), the landmark nearest each: agent 0 right, agent 1 left
    obs[0, 0, 0:2] = 0.0
    marks = np.array([[0.5, 0.1], [5.0, -5.0]])
    for i in range(2):
        obs[0, i, 4:8] = (marks - pos[i]).ravel()
    assert spread_levels.scripted_actions(obs, assign=False).tolist() == [[2, 1]]
    assert spread_levels.scripted_actions(obs).tolist()[0] != [2, 1]
    assert spread_levels.main(["--agents", "2", "--episodes", "6", "--out", str(tmp_path / "levels")]) == 0
    row = json.loads((tmp_path / "levels.json").read_text())["rows"][0]
    assert row["N"] == 2 and row["scripted"]["episodes"] == 6
    assert row["nearest"]["episodes"] == 6 and row["nearest"]["mean"] > row["no-op"]["mean"]
    assert row["scripted"]["mean"] > row["no-op"]["mean"] + 5 and row["scripted"]["mean"] > row["random"]["mean"] + 5


def spread_obs(agents, landmarks, vel=None):
    """simple_spread observations (1, N, 6N) of agents and landmarks at these absolute positions."""
    agents, landmarks = np.asarray(agents, float), np.asarray(landmarks, float)
    N = len(agents)
    obs = np.zeros((1, N, 6 * N))
    for i in range(N):
        obs[0, i, 0:2] = 0.0 if vel is None else vel[i]
        obs[0, i, 2:4] = agents[i]
        obs[0, i, 4 : 4 + 2 * N] = (landmarks - agents[i]).ravel()
    return obs


def test_spread_behaviour_measures_covered_claimed_and_centroid():
    import spread_behaviour

    # three agents: two on landmark 0 (one exactly, one 0.1 away), one far from everything
    obs = spread_obs([[0, 0], [0.1, 0], [3, 3]], [[0, 0], [1, 0], [0, 1]], vel=[[0, 0], [0, 0], [0.3, 0.4]])
    m = spread_behaviour.measures(obs, radius=0.15)
    assert m["covered"] == 1 and m["claimed"] == 2  # agent 2's nearest is landmark 1 or 2: two distinct in all
    assert m["landmark_distance"] == pytest.approx((0 + 0.9 + 1.0) / 3)
    assert m["speed"] == pytest.approx(0.5 / 3)
    assert m["to_centroid"] == pytest.approx(
        np.linalg.norm(np.array([[0, 0], [0.1, 0], [3, 3]]) - [1 / 3, 1 / 3], axis=1).mean()
    )
    assert spread_behaviour.main(["--agents", "2", "--policy", "scripted", "--episodes", "4"]) == 0
    assert spread_behaviour.main(["--agents", "2", "--relations", "--policy", "nearest", "--episodes", "4"]) == 0
    with pytest.raises(SystemExit):
        spread_behaviour.main(["--agents", "2", "--policy", "greedy"])


def test_spread_credit_difference_rewards_pay_each_agent_what_it_adds_to_the_team():
    import spread_credit

    import envs

    # landmarks at (0, 0) and (1, 0); agent 0 on the first, agent 1 at (1, 1): G = -(0 + 1); without agent 0 the
    # first landmark's nearest is agent 1 (sqrt 2 away), without agent 1 the second's is agent 0 (1 away), as it was
    team, without = spread_credit.team_terms(spread_obs([[0, 0], [1, 1]], [[0, 0], [1, 0]]))
    assert team.tolist() == [-1.0]
    np.testing.assert_allclose(without, [[-(2**0.5) - 1, -1.0]])  # D_0 = sqrt 2, D_1 = 0: agent 1 adds nothing
    # the one-to-one assignment of least total distance: agent 0 to (0, 0), agent 1 to (1, 0) (0 + 1 < sqrt 2 + 1);
    # then with agents at (0.9, 0) and (1, 0), agent 0 goes to (0, 0) though its nearest landmark is (1, 0)
    np.testing.assert_allclose(
        spread_credit.assigned_distances(spread_obs([[0, 0], [1, 1]], [[0, 0], [1, 0]])), [[0, 1]]
    )
    np.testing.assert_allclose(
        spread_credit.assigned_distances(spread_obs([[0.9, 0], [1, 0]], [[0, 0], [1, 0]])), [[0.9, 0]]
    )

    # on the compiled env: r_i - G / 2 is agent i's collisions (multiples of -1/2), and the shaped reward is
    # r_i - G_-i / 2 = D_i / 2 + L_i / 2 with D_i = G - G_-i >= 0
    def make():
        return envs.make("simple_spread_v3", 32, 0, backend="numba", N=4)

    env = make()
    rewards = {name: spread_credit.ShapedRewards(make(), name) for name in ("difference", "assigned", "nearest")}
    g, rng = next(iter(env.groups)), np.random.default_rng(0)
    for e in (env, *rewards.values()):
        e.reset()
    for _ in range(30):
        actions = {g: rng.integers(0, 5, (32, 4))}
        plain = env.step(actions)
        step, dense, near = (rewards[name].step(actions) for name in ("difference", "assigned", "nearest"))
        team, without = spread_credit.team_terms(plain.final.obs[g])
        collisions = plain.rewards[g] - team[:, None] / 2
        np.testing.assert_allclose(collisions * 2, np.round(collisions * 2), atol=1e-4)
        np.testing.assert_allclose(step.rewards[g], (team[:, None] - without) / 2 + collisions, atol=1e-4)
        assert (team[:, None] - without >= -1e-9).all()
        mine = spread_credit.assigned_distances(plain.final.obs[g])
        np.testing.assert_allclose(dense.rewards[g], collisions - 4 * mine / 2, atol=1e-4)
        own = spread_credit.distances(plain.final.obs[g])[1].min(-1)
        np.testing.assert_allclose(near.rewards[g], collisions - 4 * own / 2, atol=1e-4)
        assert (own <= mine + 1e-9).all()
    for e in (env, *rewards.values()):
        e.close()


def test_spread_encoder_ignores_the_order_of_landmarks_and_of_other_agents_and_trains(tmp_path):
    import spread_encoder
    import torch

    torch.manual_seed(0)
    enc = spread_encoder.Entities(3, 3, 16)
    x = torch.randn(5, 3, 18 + 3)
    landmarks, others = [4, 5, 6, 7, 8, 9], [10, 11, 12, 13]
    swapped = x.clone()
    swapped[..., landmarks] = x[..., [8, 9, 4, 5, 6, 7]]  # landmark order 2, 0, 1
    swapped[..., others] = x[..., [12, 13, 10, 11]]
    torch.testing.assert_close(enc(swapped), enc(x), rtol=1e-5, atol=1e-5)
    moved = x.clone()
    moved[..., 4] += 1.0  # a landmark elsewhere: another output
    assert (enc(moved) - enc(x)).abs().max() > 1e-3
    seconds = spread_encoder.cost(n_agents=2, envs=4, steps=5, repeats=1)
    assert set(seconds) == {"attention", "pairs", "plain"} and min(seconds.values()) > 0


@pytest.mark.parametrize(
    "probe, flags",
    [
        ("spread_credit.py", ["--reward", "assigned"]),
        ("spread_encoder.py", []),
        ("spread_encoder.py", ["--encoder", "pairs"]),
    ],
)
def test_spread_training_probes_run_mappo_and_refuse_another_env(tmp_path, monkeypatch, probe, flags):
    import spread_credit

    mappo = spread_credit.mappo  # the module both probes import and patch
    for name in ("make_env", "Policy", "fast_acting", "per_agent"):  # the probes patch them: restored after the test
        monkeypatch.setattr(mappo, name, getattr(mappo, name))
    script = Path(__file__).resolve().parents[1] / "probes" / probe
    tiny = [
        "--env-kwargs",
        '{"N": 2}',
        "--total-timesteps",
        "100",
        "--num-envs",
        "4",
        "--eval-interval",
        "0",
        "--final-eval-episodes",
        "2",
        "--run-dir",
        str(tmp_path / "run"),
    ]
    script_runs.run_captured(script, *flags, *tiny)  # in this process: no torch import per run
    assert json.loads((tmp_path / "run" / "final_eval.json").read_text())["episodes"] == 2
    patched = mappo.make_env if probe == "spread_credit.py" else mappo.Policy
    assert patched.__name__ in ("make_shaped_env", "EntityPolicy")  # the run trained the probe's variant
    refused = script_runs.run_captured(script, "--env-id", "simple_v3", check=False)
    assert refused.returncode != 0 and "simple_spread_v3" in refused.stderr


def test_spread_relation_layer_ignores_the_order_of_landmarks_and_of_other_agents():
    import spread_encoder
    import torch

    torch.manual_seed(0)
    enc = spread_encoder.Pairs(3, 3, 16)
    x = torch.randn(5, 3, 18 + 3)
    swapped = x.clone()
    swapped[..., 4:10] = x[..., [8, 9, 4, 5, 6, 7]]  # landmark order 2, 0, 1
    swapped[..., 10:14] = x[..., [12, 13, 10, 11]]  # the two other agents swapped
    torch.testing.assert_close(enc(swapped), enc(x), rtol=1e-5, atol=1e-5)
    moved = x.clone()
    moved[..., 10] += 1.0  # another agent elsewhere: another output
    assert (enc(moved) - enc(x)).abs().max() > 1e-4


def test_spread_study_tables_and_plots_each_setting_against_n_beside_the_levels(tmp_path, monkeypatch):
    import json
    import shutil

    import spread_study

    out = tmp_path / "agents"
    out.mkdir()
    shutil.copy(spread_study.OUT / "levels.json", out / "levels.json")

    def row(algo, n, finals, steps=10_000_000):
        kwargs = json.dumps({"N": n}) if n != 3 else "{}"
        per_seed = [{"seed": i, "final_policy": {"mean": f}} for i, f in enumerate(finals)]
        return {"algo": algo, "config": {"env_kwargs": kwargs}, "per_seed": per_seed, "total_timesteps": steps}

    (out / "mappo-relations-n6.json").write_text(json.dumps(row("mappo-relations-n6", 6, [-17.0, -15.0])))
    (out / "mappo-relations.json").write_text(json.dumps(row("mappo-relations", 3, [-8.0])))
    (out / "mappo-relations-n4.json").write_text(json.dumps(row("mappo-relations-n4", 4, [-10.0])))
    (tmp_path / "mappo.json").write_text(json.dumps(row("mappo", 3, [-8.5, -8.1, -8.3], 5_000_000)))
    monkeypatch.setattr(spread_study, "TASK", tmp_path)
    monkeypatch.setattr(spread_study, "OUT", out)
    assert spread_study.main() == 0
    table = (out / "returns.md").read_text()
    rel = "-8.00 (1 seed; -8.00 to -8.00) | -10.00 (1 seed; -10.00 to -10.00) | -16.00 (2 seeds; -17.00 to -15.00)"
    assert f"| mappo-relations, 10M | {rel} |" in table
    assert "| mappo, 5M | -8.30 (3 seeds; -8.50 to -8.10) | – | – |" in table
    assert "| scripted controller | -8.81 | -10.73 | -14.63 |" in table
    drawn = spread_study.plotted(spread_study.rows(), spread_study.levels())
    assert list(drawn) == ["mappo-relations, 10M"]  # mappo (N = 3 alone) stays in the table
    first = (out / "returns.png").read_bytes()
    spread_study.main()
    assert (out / "returns.png").read_bytes() == first  # the JSON alone decides the bytes


def test_foraging_inputs_gives_every_food_and_player_its_offset_from_the_agent(tmp_path, monkeypatch):
    import foraging_inputs
    import iql
    import torch

    from envs.registry import build_parallel_env

    obs, _ = build_parallel_env("Foraging-8x8-2p-2f-coop").reset(seed=3)  # lbforaging's own, 2 foods and 2 players
    raw = torch.as_tensor(np.stack(list(obs.values())), dtype=torch.float32)  # (A, 12)
    raw[1, 3:6] = torch.tensor([-1.0, -1.0, 0.0])  # as if agent 1's second food were out of sight
    ego = foraging_inputs.egocentric(raw[None, None]).view(2, 4, 3)
    raw = raw.view(2, 4, 3)
    for a in range(2):
        me = raw[a, 2]
        assert torch.equal(ego[a, 2], me)  # itself: where it stands, as it was
        for k in (0, 1, 3):
            expected = torch.stack([raw[a, k, 0] - me[0], raw[a, k, 1] - me[1], raw[a, k, 2]]) * (raw[a, k, 2] > 0)
            assert torch.equal(ego[a, k], expected)
    assert torch.equal(ego[1, 1], torch.zeros(3))  # none in sight: zeros
    assert torch.equal(ego[0, 3, :2], -ego[1, 3, :2])  # each player's offset to the other, opposite
    assert torch.equal(ego[0, 0, :2] + raw[0, 2, :2], ego[1, 0, :2] + raw[1, 2, :2])  # one food, seen from both

    monkeypatch.setattr(iql.GroupQ, "forward", iql.GroupQ.forward)  # the probe patches it: restored after the test
    script = Path(__file__).resolve().parents[1] / "probes" / "foraging_inputs.py"
    tiny = ["--total-timesteps", "600", "--num-envs", "4", "--learning-starts", "200", "--batch-size", "2",
            "--eval-interval", "0", "--final-eval-episodes", "2", "--run-dir", str(tmp_path / "run")]  # fmt: skip
    script_runs.run_captured(script, "--env-id", "Foraging-2s-8x8-2p-2f-coop", *tiny)
    assert json.loads((tmp_path / "run" / "final_eval.json").read_text())["episodes"] == 2
    assert iql.GroupQ.forward.__name__ == "egocentric_forward"  # the run's networks read the egocentric frame
    refused = script_runs.run_captured(script, "--env-id", "simple_v3", check=False)
    assert refused.returncode != 0 and "Level-Based Foraging" in refused.stderr


@pytest.mark.parametrize("variant", ["base", "alt"])
def test_qtran_probe_plays_the_run_and_ascends_its_joint_value_to_a_local_maximum(tmp_path, capsys, variant):
    """A two-group qtran.py checkpoint (the speaker's 3 actions, the listener's 5): the probe's `agents` row is the
    run's own final policy; Q_jt's ascent never lowers Q_jt, ends where no one agent's move raises it, and stays at or
    below the brute-force maximum over the 15 joint actions; an agent's deviations are Q_jt at those joint actions."""
    import qtran_probe
    import torch

    script_runs.run_inline(capsys, "qtran", "--env-id", "simple_speaker_listener_v4", "--variant", variant,
                           "--num-envs", 4, "--total-timesteps", 400, "--learning-starts", 200, "--batch-size", 4,
                           "--eval-interval", 0, "--final-eval-episodes", 20, "--run-dir", tmp_path)  # fmt: skip
    qtran_probe.main([str(tmp_path / "last.pt"), "--episodes", "20", "--out", str(tmp_path / "probe.json")])
    rows = json.loads((tmp_path / "probe.json").read_text())
    assert [r["policy"] for r in rows] == ["agents", "joint"]
    final = json.loads((tmp_path / "final_eval.json").read_text())["returns"]
    assert rows[0]["return"] == pytest.approx(float(np.mean(final)), abs=1e-4)
    assert all(0 <= r["moved"] <= 1 and r["spread"] >= 0 and r["opt_gap"] >= 0 for r in rows)

    net, specs, args = qtran_probe.load(str(tmp_path / "last.pt"))
    team = qtran_probe.Team(net, specs, variant == "alt")
    env = qtran_probe.make(args.env_id, num_envs=8, seed=1, backend="numba")
    hidden = {g: torch.zeros(1, 8, spec.n_agents, args.hidden_size) for g, spec in specs.items()}
    with torch.no_grad():
        greedy = team.observe(env.reset(), hidden).argmax(-1)
        joint = team.ascend(greedy)
        sizes = [spec.action_dim for spec in specs.values() for _ in range(spec.n_agents)]
        assert sizes == [3, 5]
        for i, n in enumerate(sizes):  # where the ascent ends, no one agent's move raises Q_jt (alt: its own head's)
            d = team.deviations(joint, i)
            assert (d.max(-1).values <= d.gather(-1, joint[:, i : i + 1])[:, 0] + 1e-5).all()
            assert torch.isinf(d[:, n:]).all()  # the padded actions are never chosen
        if variant == "base":  # one Q_jt: the ascent climbs it, and an agent's deviations are Q_jt's values
            assert all(r["gain"] >= 0 for r in rows)
            q_joint = team.value(joint)[0]
            assert (q_joint >= team.value(greedy)[0] - 1e-6).all()
            every = [team.value(u.expand(8, 2))[0] for u in torch.cartesian_prod(*map(torch.arange, sizes))]
            every = torch.stack(every)
            assert (q_joint <= every.max(0).values + 1e-5).all()
            for i, n in enumerate(sizes):
                d = team.deviations(joint, i)
                for a in range(n):
                    u = joint.clone()
                    u[:, i] = a
                    assert torch.allclose(d[:, a], team.value(u)[0], atol=1e-5)
    env.close()
    with pytest.raises(SystemExit, match="does not exist"):
        qtran_probe.load(str(tmp_path / "missing.pt"))


def test_greedy_actions_counts_the_first_episode_of_each_env_and_only_live_agents():
    import greedy_actions

    from envs.api import Observation

    counts = {"agent": np.zeros(3, np.int64)}
    make = greedy_actions.counting(lambda n, rng: lambda obs, done: {"agent": np.full((n, 2), 2)}, counts)
    act = make(2, None)
    mask = np.array([[True, True], [True, False]])  # env 1's second agent is dead
    obs = Observation(obs={"agent": np.zeros((2, 2, 1))}, state=np.zeros((2, 1)), agent_mask={"agent": mask},
                      avail_actions={})  # fmt: skip
    act(obs, None)  # 3 live agents act
    act(obs, np.array([True, False]))  # env 0 has finished its first episode: only env 1's live agent counts
    act(obs, np.array([False, False]))
    assert counts["agent"].tolist() == [0, 0, 5]


def test_greedy_actions_plays_a_checkpoint_on_the_final_episodes_and_names_the_actions(tmp_path, capsys):
    """An iql checkpoint of Level-Based Foraging played on the first final episodes: its return is the run's own
    final-policy number on those episodes, the shares are the package's actions and sum to 1; a path that is not a
    checkpoint, or a checkpoint with continuous actions, is refused in one line."""
    import greedy_actions

    script_runs.run_inline(capsys, "iql", "--env-id", "Foraging-8x8-2p-2f-coop", "--num-envs", "2", "--total-timesteps",
                           400, "--learning-starts", 200, "--batch-size", 4, "--eval-interval", 0,
                           "--final-eval-episodes", 20, "--run-dir", tmp_path / "iql")  # fmt: skip
    greedy_actions.main([str(tmp_path / "iql" / "last.pt"), "--episodes", "20", "--out", str(tmp_path / "rows.json")])
    (row,) = json.loads((tmp_path / "rows.json").read_text())
    final = json.loads((tmp_path / "iql" / "final_eval.json").read_text())["returns"]
    assert row["algo"] == "iql" and row["env_id"] == "Foraging-8x8-2p-2f-coop" and row["episodes"] == 20
    assert row["return"] == pytest.approx(float(np.mean(final[:20])), abs=1e-6)
    assert row["team"] == pytest.approx(2 * row["return"])
    shares = row["actions"]["agent"]
    assert list(shares) == ["none", "north", "south", "west", "east", "load"]
    assert sum(shares.values()) == pytest.approx(1, abs=0.01)
    with pytest.raises(SystemExit, match="does not exist"):
        greedy_actions.main([str(tmp_path / "missing.pt")])
    script_runs.run_inline(capsys, "maddpg", "--env-id", "simple_spread_v3", "--num-envs", "2", "--total-timesteps",
                           200, "--learning-starts", 100, "--eval-interval", 0, "--final-eval-episodes", 2,
                           "--run-dir", tmp_path / "maddpg")  # fmt: skip
    with pytest.raises(SystemExit, match="continuous actions"):
        greedy_actions.main([str(tmp_path / "maddpg" / "last.pt"), "--episodes", "2"])


def test_qmix_epymarl_gap_centres_or_scales_the_targets_rewards_and_drops_the_memory(tmp_path, monkeypatch):
    """The probe's switches: the targets are qmix.py's own on the rewards only centred or only scaled by the running
    statistics of every stored step sampled, the feed-forward agent's Q at a step reads that step alone, and the script
    runs qmix.py with them (qmix.py's own flags passed on), says what it switched on in probe.json, and refuses to run
    without a --run-dir or with both halves (that is qmix.py's --standardise-rewards)."""
    import qmix_epymarl_gap as gap
    import torch

    qmix = gap.qmix  # algos/qmix.py, as the probe imports it
    T, B = 5, 3
    mask = np.ones((T + 1, B), bool)
    mask[3:, 2] = False  # episode 2 ends after 3 steps: its padding does not count
    batch = {"reward": np.zeros((T + 1, B), np.float32), "terminated": np.zeros((T + 1, B), bool), "loss_mask": mask}
    batch["reward"][1, 0], batch["reward"][2, 2], batch["reward"][4, 2] = 0.5, 0.25, 9.0  # 9.0: padding
    args = type("A", (), {"gamma": 0.99, "td_lambda": 0.0, "n_step": 1})()
    counted = batch["reward"][mask]
    for centre, scale, expected in [(True, False, batch["reward"] - counted.mean()),
                                    (False, True, batch["reward"] / counted.std())]:  # fmt: skip
        monkeypatch.setattr(gap, "REWARDS", gap.RunningNorm())
        monkeypatch.setattr(gap, "CENTRE", centre)
        monkeypatch.setattr(gap, "SCALE", scale)
        got = gap.half_standardised_td_targets(batch, torch.zeros(T, B), args)  # one step on zero values: r itself
        np.testing.assert_allclose(got, expected[:-1], rtol=1e-2)
        assert gap.REWARDS.count.item() == pytest.approx(mask.sum(), abs=1e-3)

    net = gap.FeedForwardQ(4, 3, 8)
    x = torch.randn(6, 2, 4)
    q, h = net(x)
    assert q.shape == (6, 2, 3) and torch.equal(h, torch.zeros(1, 2, 8))
    y = x.clone()
    y[:3] = torch.randn(3, 2, 4)  # other earlier steps: the same Q from step 3 on
    assert torch.equal(net(y)[0][3:], q[3:]) and not torch.equal(net(y)[0][:3], q[:3])

    monkeypatch.setattr(qmix, "td_targets", qmix.td_targets)  # the probe patches both: restored after the test
    monkeypatch.setattr(qmix, "RecurrentQ", qmix.RecurrentQ)
    script = Path(__file__).resolve().parents[1] / "probes" / "qmix_epymarl_gap.py"
    tiny = ["--env-id", "Foraging-8x8-2p-2f-coop", "--total-timesteps", "600", "--num-envs", "4", "--learning-starts",
            "200", "--batch-size", "2", "--eval-interval", "0", "--final-eval-episodes", "2"]  # fmt: skip
    script_runs.run_captured(script, "--feed-forward", "--standardise-rewards", *tiny, "--run-dir", tmp_path / "both")
    assert json.loads((tmp_path / "both" / "config.json").read_text())["standardise_rewards"] is True  # qmix.py's flag
    # (that run first: the runs share this process, and one with a half leaves qmix.td_targets patched)
    script_runs.run_captured(script, "--feed-forward", "--scale-rewards", *tiny, "--run-dir", tmp_path / "run")
    assert json.loads((tmp_path / "run" / "final_eval.json").read_text())["episodes"] == 2
    probe = json.loads((tmp_path / "run" / "probe.json").read_text())
    assert probe == {"--centre-rewards": False, "--scale-rewards": True, "--feed-forward": True}
    assert (qmix.RecurrentQ.__name__, qmix.td_targets.__name__) == ("FeedForwardQ", "half_standardised_td_targets")
    refused = script_runs.run_captured(script, *tiny, check=False)
    assert refused.returncode != 0 and "--run-dir" in refused.stderr
    for flags in (["--centre-rewards", "--scale-rewards"], ["--centre-rewards", "--standardise-rewards"]):
        both = script_runs.run_captured(script, *flags, *tiny, "--run-dir", tmp_path / "no", check=False)
        assert both.returncode != 0 and "give one of" in both.stderr
