"""runtime/opponents.py: every script's checkpoint plays a group (actor()), --opponent, --self-play, and the errors."""

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from script_runs import run_inline, scalars

import envs
from envs.api import GroupSpec, Observation
from runtime import FINAL_SEED, evaluate
from runtime.opponents import Frozen, load_actor, load_team, parse_opponent, random_actor

ADVERSARY = ["--env", "simple_adversary_v3"]
# tiny runs: a few updates, then the final policy plays the first episodes of the fixed set
TINY = {
    "mappo": ["--num-envs", 4, "--total-timesteps", 200],
    "ippo": ["--num-envs", 4, "--total-timesteps", 200],
    "happo": ["--num-envs", 4, "--total-timesteps", 200],
    "commnet": ["--num-envs", 4, "--total-timesteps", 200],
    "ic3net": ["--num-envs", 4, "--total-timesteps", 200],
    "tarmac": ["--num-envs", 4, "--total-timesteps", 200],
    "coma": ["--num-envs", 4, "--total-timesteps", 200],
    "vdac": ["--num-envs", 4, "--total-timesteps", 200],
    "maddpg": ["--num-envs", 4, "--total-timesteps", 200, "--learning-starts", 100, "--batch-size", 16],
    "matd3": ["--num-envs", 4, "--total-timesteps", 200, "--learning-starts", 100, "--batch-size", 16],
    "iddpg": ["--num-envs", 4, "--total-timesteps", 200, "--learning-starts", 100, "--batch-size", 16],
    "masac": ["--num-envs", 4, "--total-timesteps", 200, "--learning-starts", 100, "--batch-size", 16],
    "isac": ["--num-envs", 4, "--total-timesteps", 200, "--learning-starts", 100, "--batch-size", 16],
    "iql": ["--num-envs", 4, "--total-timesteps", 400, "--learning-starts", 200, "--batch-size", 4],
    "vdn": ["--num-envs", 4, "--total-timesteps", 400, "--learning-starts", 200, "--batch-size", 4],
    "qmix": ["--num-envs", 4, "--total-timesteps", 400, "--learning-starts", 200, "--batch-size", 4],
    "wqmix": ["--num-envs", 4, "--total-timesteps", 400, "--learning-starts", 200, "--batch-size", 4],
    "qtran": ["--num-envs", 4, "--total-timesteps", 400, "--learning-starts", 200, "--batch-size", 4],
    "dcg": ["--num-envs", 4, "--total-timesteps", 400, "--learning-starts", 200, "--batch-size", 4],
    "mfq": ["--num-envs", 4, "--total-timesteps", 400, "--learning-starts", 200, "--batch-size", 4],
    "mfac": ["--num-envs", 4, "--total-timesteps", 200],
}
EVAL = ["--eval-interval", 0, "--eval-episodes", 2, "--final-eval-episodes", 6]
# one cooperative team: simple_spread
TEAM_ONLY = {"vdn", "qmix", "wqmix", "qtran", "dcg", "vdac", "happo", "commnet", "ic3net", "tarmac"}


def train(capsys, algo, run_dir, *flags):
    run_inline(capsys, algo, *TINY[algo], *EVAL, *flags, "--run-dir", run_dir)
    return json.loads((run_dir / "final_eval.json").read_text())


def replay(env_id, makers, episodes, **kwargs):
    """Returns (and per group) of the first episodes of the fixed set, every group played by `makers`."""
    make_env = lambda n, seed: envs.make(env_id, n, seed, backend="pettingzoo", **kwargs)  # noqa: E731
    return evaluate(make_env, lambda n, rng: Frozen(dict(makers), n, 0).actions, episodes, FINAL_SEED)


@pytest.mark.parametrize("algo", list(TINY))
def test_every_scripts_actor_replays_its_final_evaluation(algo, tmp_path, capsys):
    """actor() of every script, group by group, plays the fixed episodes exactly as the run's own final policy."""
    env_id = "simple_spread_v3" if algo in TEAM_ONLY else "simple_adversary_v3"
    final = train(capsys, algo, tmp_path, "--env", env_id)
    ckpt = torch.load(tmp_path / "last.pt", weights_only=True)
    kwargs = {"continuous_actions": True} if ckpt["args"]["continuous_actions"] else {}  # the DDPG family's default
    groups = envs.make(env_id, 1, 0, backend="pettingzoo", **kwargs).groups
    makers = {g: (load_actor(str(tmp_path / "last.pt"), env_id, s, g, "cpu"), g) for g, s in groups.items()}
    returns, per_group = replay(env_id, makers, 6, **kwargs)
    np.testing.assert_allclose(returns, final["returns"], atol=1e-3)
    assert set(per_group) == set(ckpt["signature"]) - {"state_shape"}


@pytest.mark.parametrize("algo", ["dcg", "commnet", "ic3net", "tarmac", "qmix"])
def test_load_team_replays_a_two_group_teams_final_evaluation(algo, tmp_path, capsys):
    """The speaker and the listener (two groups) of one checkpoint, by load_team, play the fixed episodes exactly as
    the run's own final policy: jointly (one coordination graph, one channel of messages: team_actor) or group by
    group (qmix). A joint team cut at its groups' borders (load_actor per group) plays another policy."""
    env_id = "simple_speaker_listener_v4"
    final = train(capsys, algo, tmp_path, "--env", env_id)
    groups = dict(envs.make(env_id, 1, 0, backend="pettingzoo").groups)
    make_env = lambda n, seed: envs.make(env_id, n, seed, backend="pettingzoo")  # noqa: E731
    team = load_team(str(tmp_path / "last.pt"), env_id, groups, "cpu")
    returns, _ = evaluate(make_env, team, 6, FINAL_SEED)
    np.testing.assert_allclose(returns, final["returns"], atol=1e-3)
    if algo == "ic3net":
        return  # a tiny run's greedy gates (the mode of near-even logits) may leave one deaf: a cut may change nothing
    cut, _ = replay(env_id, {g: (load_actor(str(tmp_path / "last.pt"), env_id, s, g, "cpu"), g) for g, s in
                             groups.items()}, 6)  # fmt: skip
    assert (algo == "qmix") == np.allclose(cut, final["returns"], atol=1e-3)


def test_an_opponent_from_another_script_plays_as_its_checkpoint(tmp_path, capsys):
    """MAPPO's adversary, frozen into an IQL run: the run's final evaluation is what the two actors play together."""
    train(capsys, "mappo", tmp_path / "m", *ADVERSARY)
    final = train(capsys, "iql", tmp_path / "i", *ADVERSARY, "--opponent", f"adversary={tmp_path / 'm' / 'last.pt'}")
    ckpt = torch.load(tmp_path / "i" / "last.pt", weights_only=True)
    assert set(ckpt["signature"]) == {"agent", "state_shape"}  # the frozen group is part of the env
    assert not scalars(tmp_path / "i", "losses/td_loss/adversary")
    groups = envs.make("simple_adversary_v3", 1, 0, backend="pettingzoo").groups
    makers = {"agent": (load_actor(str(tmp_path / "i" / "last.pt"), "simple_adversary_v3", groups["agent"], "agent",
                                   "cpu"), "agent"),
              "adversary": (load_actor(str(tmp_path / "m" / "last.pt"), "simple_adversary_v3", groups["adversary"],
                                       "adversary", "cpu"), "adversary")}  # fmt: skip
    returns, per_group = replay("simple_adversary_v3", makers, 6)
    np.testing.assert_allclose(returns, final["returns"], atol=1e-3)
    assert per_group["adversary"].mean() == pytest.approx(final["per_group"]["adversary"], abs=1e-3)


def test_self_play_pool_grows_at_the_interval_and_resume_reloads_it(tmp_path, capsys):
    flags = ["--env", "battle_v4", "--map-size", 12, "--max-cycles", 20, "--num-envs", 4, "--num-steps", 5,
             "--self-play", "blue", "--self-play-interval", 40, "--self-play-pool", 2, *EVAL[:4],
             "--final-eval-episodes", 2]  # fmt: skip
    run_inline(capsys, "mappo", *flags, "--total-timesteps", 100, "--run-dir", tmp_path)
    pool = sorted(int(p.stem[5:]) for p in (tmp_path / "pool").glob("step_*.pt"))
    assert pool == [0, 40, 80]  # the first snapshot at the start, then one per 40 env steps (20 per iteration)
    drawn = scalars(tmp_path, "charts/self_play_opponent_step")
    assert [s for s, _ in drawn] == pool  # a draw at every snapshot ...
    assert all(v in pool[max(0, i - 1) : i + 1] for i, (_, v) in enumerate(drawn))  # ... from the last 2 snapshots
    snap = torch.load(tmp_path / "pool" / "step_40.pt", weights_only=True)
    assert set(snap["signature"]) == {"red", "state_shape"} and snap["global_step"] == 40
    run_inline(capsys, "mappo", "--resume", tmp_path, "--total-timesteps", 160)
    pool = sorted(int(p.stem[5:]) for p in (tmp_path / "pool").glob("step_*.pt"))
    assert pool == [0, 40, 80, 120, 160]
    # a past red plays blue in another run: the checkpoint's group is named after @
    run_inline(capsys, "iql", *flags[:8], *TINY["iql"][2:], *EVAL, "--opponent",
               f"blue={tmp_path / 'pool' / 'step_80.pt'}@red", "--run-dir", tmp_path / "q")  # fmt: skip
    assert (tmp_path / "q" / "DONE").exists()


def test_random_actor_picks_only_available_actions():
    spec = GroupSpec("g", ("a", "b"), (3,), np.dtype(np.float32), True, 4, has_action_mask=True)
    avail = np.zeros((50, 2, 4), bool)
    avail[:, 0, 1] = avail[:, 1, 2:] = True
    obs = Observation({"g": np.zeros((50, 2, 3))}, np.zeros((50, 1)), {"g": np.ones((50, 2), bool)}, {"g": avail})
    a = random_actor(spec)(50, np.random.default_rng(0))(obs, None)["g"]
    assert (a[:, 0] == 1).all() and set(a[:, 1]) == {2, 3}


def test_opponent_spec_parsing():
    assert parse_opponent("blue=runs/x/last.pt") == ("blue", "runs/x/last.pt", "blue")
    assert parse_opponent("blue=runs/x@y/last.pt@red") == ("blue", "runs/x@y/last.pt", "red")
    assert parse_opponent("blue=runs/x@y/last.pt") == ("blue", "runs/x@y/last.pt", "blue")


class NoCapture:  # run_inline's capsys, for a module-scoped fixture
    def readouterr(self):
        return type("Captured", (), {"out": "", "err": ""})()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A MAPPO checkpoint of simple_adversary (both groups learn), and an IQL one whose adversary was frozen."""
    d = tmp_path_factory.mktemp("ckpts")
    for algo, flags in (("mappo", []), ("iql", ["--random-groups", "adversary"])):
        run_inline(NoCapture(), algo, *TINY[algo], *EVAL, *ADVERSARY, *flags, "--run-dir", d / algo)
    return d


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--opponent", "adversary"], "is not GROUP=PATH"),
        (["--opponent", "adversary=nowhere.pt"], "--opponent adversary=nowhere.pt: checkpoint does not exist"),
        (["--opponent", "zombies={m}"], "--opponent ['zombies']: simple_adversary_v3 has the groups"),
        (["--opponent", "adversary={m}", "--random-groups", "adversary"], "frozen twice"),
        (["--opponent", "adversary={m}", "agent={m}"], "freeze every group"),
        (["--opponent", "adversary={i}"], "has no trained group 'adversary' (it did not learn there: it was frozen)"),
        (["--opponent", "agent={m}@adversary"], "its group 'adversary' has [agents, observation shape"),
        (["--opponent", "agent={m}@ghosts"], "has no trained group 'ghosts'"),
        (["--self-play", "adversary"], "--self-play adversary: it needs exactly one learning group of the same shape"),
    ],
)
def test_bad_opponents_fail_with_one_clear_error(flags, message, checkpoints, capsys):
    flags = [str(f).format(m=checkpoints / "mappo" / "last.pt", i=checkpoints / "iql" / "last.pt") for f in flags]
    code, _, err = run_inline(capsys, "mappo", *TINY["mappo"], *EVAL, *ADVERSARY, *flags, check=False)
    assert code == 2 and message in err, err
    assert "Traceback" not in err


def test_a_one_team_env_says_there_is_nothing_to_freeze(capsys):
    code, _, err = run_inline(capsys, "qmix", *TINY["qmix"], *EVAL, "--env", "Foraging-8x8-2p-2f-coop",
                              "--random-groups", "blue", check=False)  # fmt: skip
    assert code == 2 and "Traceback" not in err, err
    assert "--random-groups ['blue']: Foraging-8x8-2p-2f-coop has the groups ['agent']; one team, nothing to freeze: " \
           "drop the flag" in err, err  # fmt: skip


def test_a_checkpoint_of_another_env_is_refused(checkpoints):
    spec = envs.make("simple_spread_v3", 1, 0, backend="pettingzoo").groups["agent"]
    with pytest.raises(ValueError, match="was trained on simple_adversary_v3, not simple_spread_v3"):
        load_actor(str(checkpoints / "mappo" / "last.pt"), "simple_spread_v3", spec, "agent", "cpu")


# --- results/tournament.py ---

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "results"))
import tournament  # noqa: E402


class ScriptedBattle:
    """Two teams of 3; env 0: blue loses 2 agents at step 1, the time limit ends it at step 2; env 1: red loses one
    at step 1, then a team is wiped out at step 2 (every agent flagged, as MAgent2 does: the flags do not say which)."""

    def __init__(self, n, seed):
        spec = lambda g: GroupSpec(g, tuple(f"{g}_{i}" for i in range(3)), (2,), np.dtype(np.float32), True, 3)  # noqa: E731
        self.groups, self.num_envs, self.t = {"red": spec("red"), "blue": spec("blue")}, n, 0

    def obs(self, alive):
        return Observation({g: np.zeros((2, 3, 2)) for g in alive}, np.zeros((2, 1)), alive)

    def reset(self, seed=None):
        self.t = 0
        return self.obs({g: np.ones((2, 3), bool) for g in self.groups})

    def step(self, actions):
        self.t += 1
        dead = {g: np.zeros((2, 3), bool) for g in self.groups}
        if self.t == 1:
            dead["blue"][0, :2] = dead["red"][1, 0] = True
        else:
            dead["blue"][0, :2] = dead["red"][1, 0] = True
            dead["red"][1] = dead["blue"][1] = True  # env 1 ends by a wipe-out: all flagged
        done = np.array([self.t == 2, self.t == 2])
        truncated = np.array([self.t == 2, False])
        episodes = [envs.EpisodeStats(i, {"red": 1.0, "blue": -1.0}, 0.0, 2) for i in range(2)] if self.t == 2 else []
        rewards = {g: np.zeros((2, 3), np.float32) for g in self.groups}
        alive = self.obs({g: ~dead[g] for g in self.groups})
        return envs.StepResult(alive, rewards, dead, truncated, done, alive, episodes)

    def close(self):
        pass


def test_tournament_counts_survivors_and_kills_on_both_kinds_of_ending():
    random = lambda spec: (random_actor(spec), spec.name)  # noqa: E731
    env = ScriptedBattle(2, 0)
    rows = tournament.battles(ScriptedBattle, ["red", "blue"], random(env.groups["red"]), random(env.groups["blue"]),
                              2, 0, 2)  # fmt: skip
    # env 0: time limit, blue lost 2: red 3 alive, blue 1, red killed 2; env 1: wiped out after red lost 1: blue had 3
    # left before the last step and red 2, so red (fewer) was the team wiped out
    assert rows[0][:4] == [3, 1, 2, 0]
    assert rows[1][:4] == [0, 3, 0, 3]


def test_tournament_scores_pool_both_sides():
    # a beats b 3-0 as the first side and draws 3 as the second: 4.5 of 6 for a, 1.5 for b
    outcomes = {"a vs b": [[2, 0, 1, 0, 0, 0]] * 3, "b vs a": [[1, 1, 0, 0, 0, 0]] * 3}
    score, wins, draws, played = tournament.scores(["a", "b"], outcomes)
    assert score.tolist() == [[0, 4.5], [1.5, 0]] and wins.tolist() == [[0, 3], [0, 0]]
    assert draws.tolist() == [[0, 3], [3, 0]] and played.tolist() == [[0, 6], [6, 0]]


def test_tournament_ratings_and_intervals():
    elo = 400 * np.log10(tournament.bradley_terry(np.array([[0.0, 75.0], [25.0, 0.0]])))
    assert elo[0] - elo[1] == pytest.approx(400 * np.log10(75.5 / 25.5), abs=0.5)  # the half-win prior, then 3:1
    lo, hi = tournament.wilson(0.5, 100)
    assert (lo, hi) == pytest.approx((0.404, 0.596), abs=1e-3)


def test_tournament_runs_and_writes_its_tables(checkpoints, tmp_path, capsys):
    flags = ["--env", "simple_adversary_v3", "--backend", "pettingzoo", "--battles", 3, "--num-envs", 3,
             "--out", tmp_path]  # fmt: skip
    code = tournament.main([str(f) for f in [*flags, "--player", f"m={checkpoints / 'mappo' / 'last.pt'}", "--random"]])
    assert code == 0
    record = json.loads((tmp_path / "tournament.json").read_text())
    assert set(record["outcomes"]) == {"m vs random", "random vs m"}
    assert all(len(rows) == 3 for rows in record["outcomes"].values())
    md = (tmp_path / "tournament.md").read_text()
    assert "| **m** |" in md and "wins / draws / losses" in md and (tmp_path / "tournament.png").stat().st_size > 0
    assert record["commit"] and record["command"].startswith("python results/tournament.py")
    # the IQL checkpoint learned only 'agent': it cannot play the adversary side without @, and one player is too few
    capsys.readouterr()
    code = tournament.main([str(f) for f in [*flags, "--player", f"i={checkpoints / 'iql' / 'last.pt'}", "--random"]])
    assert code == 2 and "its group 'agent' has [agents, observation shape" in capsys.readouterr().err
    code = tournament.main([str(f) for f in [*flags, "--random"]])
    assert code == 2 and "at least two players" in capsys.readouterr().err


def test_tournament_pools_a_scripts_seeds_and_its_interval_carries_their_spread():
    # script A: seed a1 beats b in all 100 battles, seed a2 loses all 100; script B has one seed
    won, lost = [[3, 0, 3, 0, 0, 0]] * 50, [[0, 3, 0, 3, 0, 0]] * 50
    outcomes = {"a1 vs b": won, "b vs a1": lost, "a2 vs b": lost, "b vs a2": won, "a1 vs a2": won, "a2 vs a1": won}
    names, scripts = ["a1", "a2", "b"], {"a1": "A", "a2": "A", "b": "B"}
    score, played, order, members = tournament.script_scores(names, outcomes, scripts)
    s, p = tournament.pooled(score, played, members, np.ones(3))
    assert order == ["A", "B"] and s[0, 1] / p[0, 1] == 0.5 and p[0, 0] == 0  # A's seeds among themselves left out
    rate_ci, elo_ci = tournament.bootstrap_scripts(score, played, order, members, resamples=400)
    assert rate_ci[:, 0, 1].tolist() == [0.0, 1.0]  # resampled seeds: {a1, a1} wins all, {a2, a2} loses all
    assert tournament.wilson(0.5, 400)[1] < 0.6  # what pooling the 400 battles as independent would have claimed
    assert elo_ci[0, 0] < 0 < elo_ci[1, 0]
    md = tournament.tables(names, ["red", "blue"], outcomes, argparse.Namespace(battles=50), scripts)
    assert "| **A** | — | 0.50 [0.00, 1.00] |" in md and "| A | 2 | +0 [" in md and "| **a1** | — |" in md
    assert "| A | B | 0.50 | 2 | 1 / 0 / 1 | 0 | 1.5 : 1.5 |" in md  # one seed pair each way, pooled level
    assert "red (first) won 66.7%, blue 33.3%, drawn 0.0%; in 1 of the 3 seed pairs" in md  # a1, a2: each wins red


def test_seed_pairs_count_the_ones_against_the_pooled_score_and_leave_random_out():
    # script A: seeds a1 and a2 beat b in every battle, a3 loses every one: pooled 2/3, one seed pair against it
    won, lost = [[3, 0, 3, 0, 0, 0]] * 10, [[0, 3, 0, 3, 0, 0]] * 10
    drawn = [[1, 1, 0, 0, 0, 0]] * 10
    names, scripts = ["a1", "a2", "a3", "b", "random"], {"a1": "A", "a2": "A", "a3": "A", "b": "B", "random": "random"}
    outcomes = {f"{x} vs {y}": drawn for x in names for y in names if x != y}
    outcomes |= {"a1 vs b": won, "b vs a1": lost, "a2 vs b": won, "b vs a2": lost, "a3 vs b": lost, "b vs a3": won}
    md = "\n".join(tournament.seed_pair_tables(names, ["red", "blue"], outcomes, scripts))
    assert "| A | B | 0.67 | 3 | 2 / 0 / 1 | 1 |" in md and "| A | random |" not in md and "| B | random |" not in md
    assert "Of the 3 seed pairs between two learning scripts, 1 go against their scripts' pooled score and 0 are" in md
    assert "drawn 50.0%; in 0 of the 6 seed pairs" in md  # the 12 ordered pairs of a1-a3 and b: 6 decided, 6 drawn


def test_a_tournament_launched_again_reuses_its_pairs_and_plays_only_a_new_players(checkpoints, tmp_path, capsys,
                                                                                  monkeypatch):  # fmt: skip
    flags = ["--env", "simple_adversary_v3", "--backend", "pettingzoo", "--battles", 2, "--num-envs", 2,
             "--out", tmp_path, "--player", f"m={checkpoints / 'mappo' / 'last.pt'}"]  # fmt: skip
    assert tournament.main([str(f) for f in [*flags, "--random"]]) == 0
    first = json.loads((tmp_path / "tournament.json").read_text())
    assert not (tmp_path / tournament.PARTIAL).exists()  # everything it held is in tournament.json
    played = []
    real = tournament.battles
    monkeypatch.setattr(tournament, "battles", lambda *a: played.append(a) or real(*a))
    # a stopped tournament: one pair of a new player is in the partial file already
    other = tmp_path / "other.pt"
    shutil.copy(checkpoints / "mappo" / "last.pt", other)
    key = tournament.pair_key(dict(env_id="simple_adversary_v3", battles=2, seed=20_000, backend="pettingzoo",
                                   env_kwargs={}, sample=False, sample_scripts=[]), (str(other), None), (None, None),
                              tournament.sha256(str(other)), None)  # fmt: skip
    rows = [[1, 2, 0, 0, 0.0, 0.0]] * 2
    (tmp_path / tournament.PARTIAL).write_text(json.dumps({"pair": "o vs random", "key": key, "rows": rows}) + "\n{cut")
    capsys.readouterr()
    assert tournament.main([str(f) for f in [*flags, "--player", f"o={other}", "--random"]]) == 0
    assert "3 pairs reused" in capsys.readouterr().out and len(played) == 3  # m-o, o-m, random-o
    second = json.loads((tmp_path / "tournament.json").read_text())
    assert second["outcomes"]["m vs random"] == first["outcomes"]["m vs random"]
    assert second["outcomes"]["o vs random"] == rows
    assert second["scripts"] == {"m": "mappo", "o": "mappo", "random": "random"}
    assert [launch["pairs"] for launch in second["launches"]] == [2, 3]  # the first launch's cost kept
    assert tournament.main([str(f) for f in [*flags, "--player", f"o={other}", "--random"]]) == 0  # tables anew
    assert [launch["pairs"] for launch in json.loads((tmp_path / "tournament.json").read_text())["launches"]] == [
        2,
        3,
        0,
    ]


def test_a_kept_policy_plays_as_its_checkpoint(checkpoints, tmp_path, capsys):
    flags = ["--env", "simple_adversary_v3", "--backend", "pettingzoo", "--battles", 3, "--num-envs", 3, "--random"]
    run = checkpoints / "mappo"
    assert tournament.main([str(f) for f in [*flags, "--runs", run, "--keep", tmp_path / "kept"]]) == 0
    kept = tmp_path / "kept" / "mappo" / "mappo" / "last.pt"
    assert f"kept {kept}" in capsys.readouterr().out and torch.load(kept, weights_only=True)["optimizers"] == {}
    for source, out in ((run, "a"), (kept.parent, "b")):
        assert tournament.main([str(f) for f in [*flags, "--runs", source, "--out", tmp_path / out]]) == 0
    a, b = (json.loads((tmp_path / d / "tournament.json").read_text()) for d in ("a", "b"))
    assert a["outcomes"] == b["outcomes"] and list(a["players"]) == list(b["players"]) == ["mappo/mappo", "random"]


def test_sample_scripts_lets_only_those_scripts_players_sample(checkpoints, tmp_path, monkeypatch):
    asked = []  # the greedy flag of every actor built
    real = tournament.load_actor
    monkeypatch.setattr(tournament, "load_actor", lambda *a, greedy: asked.append(greedy) or real(*a, greedy=greedy))
    mappo = f"m={checkpoints / 'mappo' / 'last.pt'}"
    flags = ["--env", "simple_adversary_v3", "--backend", "pettingzoo", "--battles", 2, "--num-envs", 2, "--out",
             tmp_path, "--player", mappo, "--random", "--sample-scripts", "mappo"]  # fmt: skip
    assert tournament.main([str(f) for f in flags]) == 0
    assert asked and not any(asked)  # the MAPPO player sampled on every side, in every pair
    assert json.loads((tmp_path / "tournament.json").read_text())["sampling"] == {"m": True, "random": False}


def test_tournament_workers_play_the_same_battles(checkpoints, tmp_path):
    flags = ["--env", "simple_adversary_v3", "--backend", "pettingzoo", "--battles", 3, "--num-envs", 3,
             "--player", f"m={checkpoints / 'mappo' / 'last.pt'}", "--random"]  # fmt: skip
    assert tournament.main([str(f) for f in [*flags, "--out", tmp_path / "one"]]) == 0
    assert tournament.main([str(f) for f in [*flags, "--out", tmp_path / "two", "--workers", 2]]) == 0
    one, two = (json.loads((tmp_path / d / "tournament.json").read_text())["outcomes"] for d in ("one", "two"))
    assert one == two


# --- results/crossplay.py ---

import crossplay  # noqa: E402


@pytest.mark.parametrize(
    "env_id", ["simple_adversary_v3", "simple_crypto_v3", "simple_push_v3", "simple_tag_v3", "simple_world_comm_v3"]
)
def test_a_discrete_actions_continuous_twin_moves_the_continuous_env_exactly_alike(env_id):
    """crossplay plays a discrete team in the continuous env through the twin of its actions (e_a; world_comm's
    leadadversary, which moves and speaks: [e_(a % 5), e_(a // 5)]): mpe2 must do the same with it."""
    discrete, continuous = crossplay.make(env_id, 2, 5, False), crossplay.make(env_id, 2, 5, True)
    rng = np.random.default_rng(0)
    discrete.reset(), continuous.reset()
    for _ in range(30):
        groups = discrete.groups.items()
        actions = {g: rng.integers(0, s.action_dim, (2, s.n_agents)) for g, s in groups}
        sa = discrete.step(actions)
        twins = {g: crossplay.continuous_twin(s.action_dim, continuous.groups[g].action_dim) for g, s in groups}
        sb = continuous.step({g: twins[g](a) for g, a in actions.items()})
        for g in discrete.groups:
            np.testing.assert_array_equal(sa.next.obs[g], sb.next.obs[g])
            np.testing.assert_array_equal(sa.rewards[g], sb.rewards[g])
    discrete.close(), continuous.close()


def test_crossplay_pairs_every_script_with_every_other_across_action_spaces(tmp_path, capsys, monkeypatch):
    runs = tmp_path / "runs" / "simple_adversary_v3"
    for algo in ("mappo", "maddpg"):  # discrete and continuous (their defaults)
        run_inline(NoCapture(), algo, *TINY[algo], *EVAL, *ADVERSARY, "--run-dir", runs / f"{algo}-3m" / "seed0")
    argv = ["--env-id", "simple_adversary_v3", "--algos", "mappo,maddpg", "--seeds", "0", "--episodes", "4"]
    assert crossplay.main([*argv, "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    record = json.loads((tmp_path / "out" / "crossplay.json").read_text())
    assert set(record["per_seed"]) == {"mappo vs mappo", "mappo vs maddpg", "maddpg vs mappo", "maddpg vs maddpg"}
    assert record["continuous"] == {"mappo": False, "maddpg": True} and record["teams"] == [["adversary"], ["agent"]]
    assert all(set(r[0]) == {"adversary", "agent"} for r in record["per_seed"].values())
    assert "**adversary** (team 1) return" in (tmp_path / "out" / "crossplay.md").read_text()
    # --keep: the checkpoints without optimizer states, in the runs' layout; a cross-play from them plays alike
    kept = tmp_path / "kept" / "simple_adversary_v3" / "maddpg-3m" / "seed0" / "last.pt"
    assert crossplay.main([*argv[:3], "maddpg", *argv[4:], "--runs", str(tmp_path / "runs"), "--keep",
                           str(tmp_path / "kept")]) == 0 and f"kept {kept}" in capsys.readouterr().out  # fmt: skip
    assert torch.load(kept, weights_only=True)["optimizers"] == {}
    assert crossplay.main([*argv, "--runs", str(tmp_path / "runs"), "--keep", str(tmp_path / "kept")]) == 0
    three = tmp_path / "runs" / "simple_world_comm_v3" / "maddpg-3m" / "seed0"  # three groups: no --teams to keep
    three.mkdir(parents=True)
    shutil.copy(runs / "maddpg-3m" / "seed0" / "last.pt", three)
    with monkeypatch.context() as m:  # keeping copies files: it builds no env
        m.setattr(crossplay, "make", lambda *a, **k: pytest.fail("--keep built an env"))
        assert crossplay.main(["--env-id", "simple_world_comm_v3", "--algos", "maddpg", "--seeds", "0", "--runs",
                               str(tmp_path / "runs"), "--keep", str(tmp_path / "kept")]) == 0  # fmt: skip
    assert crossplay.main([*argv, "--runs", str(tmp_path / "kept"), "--out", str(tmp_path / "again")]) == 0
    assert json.loads((tmp_path / "again" / "crossplay.json").read_text())["per_seed"] == record["per_seed"]
    # a second run keeps the pairs whose checkpoints did not change, and plays the others (all with --fresh)
    played, play, digest = [], crossplay.play, crossplay.digest
    monkeypatch.setattr(crossplay, "play", lambda *a: played.append(1) or play(*a))
    monkeypatch.setattr(crossplay, "git_commit", lambda: "f" * 40)  # a later commit
    monkeypatch.setattr(crossplay, "digest", lambda p: "retrained" if "maddpg" in str(p) else digest(p))
    again = ["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]
    assert crossplay.main([*argv, *again]) == 0 and len(played) == 3  # every pair but mappo vs mappo
    kept = json.loads((tmp_path / "out" / "crossplay.json").read_text())
    assert kept["per_seed"]["mappo vs mappo"] == record["per_seed"]["mappo vs mappo"]
    assert kept["pair_commits"]["mappo vs mappo"] == record["commit"] != kept["commit"]
    assert [(x["commit"], x["pairs"]) for x in kept["launches"]] == [(record["commit"], 4), ("f" * 40, 3)]
    assert kept["launches"][0]["seconds"] == record["seconds"]  # each launch's cost kept
    assert "1 of 4 pairs kept from the runs of commit(s) " in (tmp_path / "out" / "crossplay.md").read_text()
    assert crossplay.main([*argv, *again]) == 0 and len(played) == 3  # nothing changed since: nothing played
    launches = lambda: [x["pairs"] for x in json.loads((tmp_path / "out" / "crossplay.json").read_text())["launches"]]  # noqa: E731
    assert launches() == [4, 3, 0]
    assert crossplay.main([*argv, *again, "--fresh"]) == 0 and len(played) == 7
    assert launches() == [4]  # --fresh: every pair played again, the earlier launches no longer describe it
    # clear errors: a team split that misses a group, a missing checkpoint
    assert crossplay.main([*argv, "--runs", str(tmp_path / "runs"), "--teams", "adversary/"]) == 2
    assert "give every group of the env ['adversary', 'agent'] once" in capsys.readouterr().err
    assert crossplay.main([*argv, "--runs", str(tmp_path / "runs"), "--variant", "10m"]) == 2
    assert "mappo-10m/seed0/last.pt (and 1 more): train the rows first" in capsys.readouterr().err


def test_crossplay_leaves_out_a_discrete_team_whose_actions_have_no_continuous_twin(tmp_path, monkeypatch):
    env_id = "simple_world_comm_v3"
    run_inline(NoCapture(), "mappo", *TINY["mappo"], *EVAL, "--env", env_id, "--run-dir", tmp_path / "m")
    specs = {c: dict(crossplay.make(env_id, 1, 0, c, "numba").groups) for c in (False, True)}
    team, ckpt = ["leadadversary", "adversary"], tmp_path / "m" / "last.pt"
    assert set(crossplay.team_actors(ckpt, env_id, team, specs, True)) == set(team)  # 20 actions, 9 dimensions
    assert crossplay.continuous_twin(20, 8) is None and crossplay.continuous_twin(7, 7) is not None
    monkeypatch.setattr(crossplay, "continuous_twin", lambda n, d: None)  # as if mpe2 had no twin of them
    with pytest.raises(crossplay.Unmappable, match="'leadadversary' has 20 discrete actions but 9 continuous"):
        crossplay.team_actors(ckpt, env_id, team, specs, True)


def test_crossplay_leaves_out_a_team_of_several_groups_that_its_script_plays_jointly(tmp_path):
    """DCG's graph spans alice and bob (two groups, one team): cut group by group, it would be another policy."""
    env_id = "simple_crypto_v3"
    run_inline(NoCapture(), "dcg", *TINY["dcg"], *EVAL, "--env", env_id, "--random-groups", "eve", "--run-dir",
               tmp_path)  # fmt: skip
    specs = {c: dict(crossplay.make(env_id, 1, 0, c, "numba").groups) for c in (False, True)}
    assert set(crossplay.team_actors(tmp_path / "last.pt", env_id, ["bob"], specs, False)) == {"bob"}
    with pytest.raises(crossplay.Unmappable, match="dcg's agents act jointly across the groups"):
        crossplay.team_actors(tmp_path / "last.pt", env_id, ["alice", "bob"], specs, False)


def test_crossplay_summary_averages_each_team_over_its_opponents_across_tasks():
    """The README's cross-task table: a team's mean over its groups, averaged over every opposing script (its own
    included) and the seed pairs; its self-play cell in brackets; the best of each row in bold; "—" for a script
    not in a task's cross-play; a pair left out ({} cells) counts as missing, not as zero."""
    two = {"env_id": "task_a", "algos": ["x", "y"], "teams": [["hunter"], ["prey", "bird"]], "per_seed": {
        "x vs x": [{"hunter": 1.0, "prey": -1.0, "bird": -3.0}, {"hunter": 3.0, "prey": -3.0, "bird": -1.0}],
        "x vs y": [{"hunter": 4.0, "prey": -4.0, "bird": 0.0}],
        "y vs x": [],  # left out
        "y vs y": [{"hunter": 0.0, "prey": 1.0, "bird": 1.0}],
    }}  # fmt: skip
    one = {"env_id": "task_b", "algos": ["y", "z"], "teams": [["a"], ["b"]], "per_seed": {
        "y vs y": [{"a": 1.0, "b": 0.0}], "y vs z": [{"a": 3.0, "b": 0.0}],
        "z vs y": [{"a": 5.0, "b": 0.0}], "z vs z": [{"a": 7.0, "b": -1.0}],
    }}  # fmt: skip
    rows = crossplay.summary([two, {"env_id": "empty", "per_seed": {}}, one]).splitlines()
    assert rows[0] == "| task: team | `x` | `y` | `z` |"
    # hunter x: (2 + 4) / 2; y: 0 (its pair with x left out); prey+bird of x: mean of (-2) and (y vs x: left out)
    assert rows[2] == "| task_a: hunter | **3.00 (2.00)** | 0.00 (0.00) | — |"
    assert rows[3] == "| task_a: prey+bird | -2.00 (-2.00) | **-0.50 (1.00)** | — |"
    assert rows[4] == "| task_b: a | — | 2.00 (1.00) | **6.00 (7.00)** |"
    assert rows[5] == "| task_b: b | — | **0.00 (0.00)** | -0.50 (-1.00) |"
    assert crossplay.summary([{"env_id": "empty", "per_seed": {}}]) == ""
