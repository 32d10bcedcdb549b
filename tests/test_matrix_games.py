"""envs/matrix_games.py: the cooperative matrix games' payoffs, their one-step and repeated forms, our interface."""

import numpy as np
import pytest
from pettingzoo.test import parallel_api_test

import envs
from envs.matrix_games import TASKS, parallel_env, payoff
from envs.registry import EnvArgumentError


def test_the_payoffs_are_the_papers():
    assert payoff("matrix_qtran").tolist() == [[8, -12, -12], [-12, 0, 0], [-12, 0, 0]]  # Son et al. 2019, Table 1a
    assert payoff("matrix_climbing").tolist() == [[11, -30, 0], [-30, 7, 6], [0, 0, 5]]  # Claus and Boutilier 1998
    assert payoff("matrix_penalty", k=-7).tolist() == [[10, 0, -7], [0, 2, 0], [-7, 0, 10]]
    with pytest.raises(ValueError, match="not a matrix game"):
        payoff("matrix_chicken")


@pytest.mark.parametrize("task", TASKS)
def test_every_joint_action_pays_both_agents_its_entry_and_the_one_step_game_terminates(task):
    env = envs.make(task, 9, 0, backend="auto")
    obs = env.reset()
    assert obs.obs["agent"].shape == (9, 2, 1) and (obs.obs["agent"] == 1).all()
    joint = np.array([[a, b] for a in range(3) for b in range(3)])
    step = env.step({"agent": joint})
    assert step.rewards["agent"].tolist() == [[payoff(task)[a, b]] * 2 for a, b in joint]
    assert step.done.all() and step.terminated["agent"].all() and not step.truncated.any()
    assert [e.episode_return for e in step.episodes] == [payoff(task)[a, b] for a, b in joint]
    parallel_api_test(parallel_env(task, episode_length=3), num_cycles=20)


def test_the_repeated_game_shows_the_step_and_ends_after_its_length():
    env = envs.make("matrix_climbing", 2, 0, episode_length=3)
    obs = env.reset()
    for t in range(3):
        assert obs.obs["agent"][0, 0].tolist() == [float(i == t) for i in range(3)]
        step = env.step({"agent": np.zeros((2, 2), np.int64)})
        assert step.done.all() == (t == 2) and step.rewards["agent"][0, 0] == 11
        obs = step.next
    assert step.episodes[0].episode_return == 33 and step.episodes[0].length == 3
    with pytest.raises(EnvArgumentError, match="episode_length must be >= 1"):
        envs.make("matrix_climbing", 1, 0, episode_length=0)
