"""algos/mfq.py: the Boltzmann target, replay that never pairs two episodes, the mean action it acts on, errors."""

import runpy
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from script_runs import run_inline, scalars

from buffers import ReplayBuffer
from buffers.kernels import neighbour_mean_actions

MFQ = runpy.run_path(str(Path(__file__).resolve().parents[1] / "algos" / "mfq.py"), run_name="mfq")
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
        want = rows[i]["agent_mean"] if ended else rows[i + 1]["agent_mean"]
        np.testing.assert_array_equal(rows[i]["agent_next_mean"], want)
    # the stored mean is the mean of the other agents' stored actions (group: every other living agent)
    for r in rows:
        np.testing.assert_allclose(
            r["agent_mean"], neighbour_mean_actions(None, r["agent_alive"], r["agent_actions"], 5)
        )
    assert scalars(tmp_path, "losses/td_loss")


@pytest.mark.parametrize("radius", [0, 6])
def test_acting_averages_over_the_view_on_grid_envs(radius, tmp_path, capsys):
    flags = ["--env", "battle_v4", "--map-size", 12, "--max-cycles", 20, "--total-timesteps", 80]
    stored = []
    original = ReplayBuffer.add

    def record(self, **step):
        stored.append(step["red_mean"].copy())
        return original(self, **step)

    with mock.patch.object(ReplayBuffer, "add", record):
        run_inline(capsys, "mfq", *TINY, *flags, "--view-radius", radius, "--run-dir", tmp_path)
    means = np.stack(stored)
    # two agents per team, on distinct cells 2 apart at the start: no neighbour within 0, each other within 6
    assert (means == 0).all() if radius == 0 else np.allclose(means[0].sum(-1), 1.0)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--mean-over", "view"], "--mean-over view needs agent positions, and simple_spread_v3 has none"),
        (["--mean-over", "nearest"], "--mean-over 'nearest' is not 'auto', 'view' or 'group'"),
        (["--temperature-end", 0], "--temperature-start and --temperature-end must be > 0"),
        (["--continuous-actions"], "mfq needs discrete actions"),
    ],
)
def test_bad_input_fails_with_one_clear_error(flags, message, capsys):
    code, _, err = run_inline(capsys, "mfq", *TINY, "--total-timesteps", 40, *flags, check=False)
    assert code == 2 and message in err, err
