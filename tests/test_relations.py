"""--relations (envs/relations.py): the declared observation layouts hold what they say in both MPE backends, the
relations are the distances they name, and every script takes the flag or refuses it in one line."""

import json
from pathlib import Path

import numpy as np
import pytest
import script_runs

import envs
from envs.relations import WithRelations, relations

ROOT = Path(__file__).resolve().parents[1]


def spread_obs(agents, landmarks):
    """(1, N, 6N) simple_spread observations of agents and landmarks at these positions (at rest)."""
    agents, landmarks = np.asarray(agents, np.float32), np.asarray(landmarks, np.float32)
    rows = []
    for i, p in enumerate(agents):
        others = [q - p for j, q in enumerate(agents) if j != i]
        rows.append(np.concatenate([[0, 0], p, *(landmarks - p), *others, np.zeros(2 * len(others))]))
    return np.asarray(rows, np.float32)[None]


def reference(obs, n):
    """Each landmark's distance to each agent from the agents' absolute positions (their own observations) and the
    landmarks' (agent 0's view): (E, N, 2N) as [own distances, nearest other agent's distances]."""
    pos = obs[..., 2:4]
    landmarks = pos[:, :1] + obs[:, :1, 4 : 4 + 2 * n].reshape(len(obs), n, 2)
    dist = np.linalg.norm(pos[:, :, None] - landmarks[:, None], axis=-1)
    others = np.stack([np.delete(dist, i, axis=1).min(1) for i in range(n)], axis=1)
    return np.concatenate([dist, others], -1)


def test_relations_are_each_landmarks_own_and_nearest_other_agents_distance():
    # agents at (0, 0), (1, 1), (3, 0); landmarks at (0, 0), (1, 0), (2, 0)
    layout = (("landmarks", 4, 3), ("agents", 10, 2))
    rel = relations(spread_obs([[0, 0], [1, 1], [3, 0]], [[0, 0], [1, 0], [2, 0]]), layout)
    np.testing.assert_allclose(rel[0, 0], [0, 1, 2, 2**0.5, 1, 1], atol=1e-6)  # own distances; the nearest other's
    np.testing.assert_allclose(rel[0, 1], [2**0.5, 1, 2**0.5, 0, 1, 1], atol=1e-6)
    np.testing.assert_allclose(rel[0, 2], [3, 2, 1, 0, 1, 2**0.5], atol=1e-6)


@pytest.mark.parametrize("n", [3, 6])
def test_both_mpe_backends_declare_the_layout_their_observations_have(n):
    made = {b: envs.make("simple_spread_v3", 3, 0, backend=b, N=n, max_cycles=4) for b in ("numba", "pettingzoo")}
    assert made["numba"].groups["agent"].entities == made["pettingzoo"].groups["agent"].entities
    assert made["numba"].groups["agent"].entities == (("landmarks", 4, n), ("agents", 4 + 2 * n, n - 1))
    rng = np.random.default_rng(0)
    for env in made.values():
        plain = WithRelations(env, "simple_spread_v3")
        d = 6 * n
        assert plain.groups["agent"].obs_shape == (d + 2 * n,) and plain.state_shape == (n * d + n * 2 * n,)
        obs = plain.reset()
        for _ in range(6):  # past a time limit: the final observations are extended too
            np.testing.assert_allclose(obs.obs["agent"][..., d:], reference(obs.obs["agent"][..., :d], n), atol=1e-5)
            np.testing.assert_array_equal(obs.state[:, : n * d], obs.obs["agent"][..., :d].reshape(3, -1))
            np.testing.assert_array_equal(obs.state[:, n * d :], obs.obs["agent"][..., d:].reshape(3, -1))
            step = plain.step({"agent": rng.integers(0, 5, (3, n))})
            final = step.final.obs["agent"]
            np.testing.assert_allclose(final[..., d:], reference(final[..., :d], n), atol=1e-5)
            obs = step.next
        plain.close()


def test_with_neighbors_the_layout_counts_the_slots_that_hold_entities():
    kw = dict(N=4, num_agent_neighbors=2, num_landmark_neighbors=6)  # 6 landmark slots, 4 of them landmarks
    layouts = {b: envs.make("simple_spread_v3", 2, 0, backend=b, **kw).groups["agent"] for b in ("numba", "pettingzoo")}
    assert layouts["numba"].entities == layouts["pettingzoo"].entities == (("landmarks", 4, 4), ("agents", 16, 2))
    assert layouts["numba"].obs_shape == layouts["pettingzoo"].obs_shape == (4 + 12 + 4 + 4,)


def test_an_env_without_a_layout_is_refused_in_one_line():
    env = envs.make("simple_tag_v3", 2, 0, backend="numba")
    with pytest.raises(ValueError, match="simple_tag_v3 declares no observation layout.*drop --relations"):
        WithRelations(env, "simple_tag_v3")
    one = envs.make("simple_spread_v3", 2, 0, backend="numba", N=1)
    with pytest.raises(ValueError, match="no landmarks or no other agents"):
        WithRelations(one, "simple_spread_v3")


def run(script, *flags):
    """The script in this process, answering as subprocess.run would (script_runs.run_captured)."""
    return script_runs.run_captured(script, *flags, check=False)


def test_a_script_trains_and_replays_with_relations_and_refuses_them_where_they_do_not_apply(tmp_path):
    script, run_dir = ROOT / "algos" / "mappo.py", tmp_path / "run"
    assert "--relations" in run(script, "--help").stdout
    flags = ["--env-id", "simple_spread_v3", "--env-kwargs", '{"N": 4}', "--num-envs", "8", "--eval-episodes", "2"]
    done = run(script, *flags, "--relations", "--total-timesteps", "1600", "--final-eval-episodes", "4",
               "--run-dir", run_dir)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((run_dir / "config.json").read_text())["relations"] is True
    replay = run(script, "--eval-checkpoint", run_dir / "last.pt")  # the checkpoint's flags: relations included
    assert replay.returncode == 0 and "return" in replay.stdout, replay.stderr[-2000:]
    plain = run(script, "--eval-checkpoint", run_dir / "last.pt", "--no-relations")
    assert (
        plain.returncode != 0
        and "Traceback" not in plain.stderr
        and "pass the same --env-id and env flags" in plain.stderr
    )
    refused = run(script, "--env-id", "simple_tag_v3", "--relations", "--run-dir", tmp_path / "tag")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "simple_tag_v3 declares no observation layout" in refused.stderr and not (tmp_path / "tag").exists()
