"""Slow, obvious reference versions of every compiled kernel: the specification.

Same names and signatures as `buffers.kernels`. Every array is time-major `(T, B)`, where B is
whatever the caller flattened (envs x agents). Two flags describe how a step ended:

* ``terminated[t]`` -- the episode truly ended at step t: the future after it is worth zero.
* ``episode_end[t]`` -- the episode ended for any reason (terminated *or* truncated by a time limit):
  the recursion must not carry values across it, but a truncated step still bootstraps.

``next_values[t]`` is the value of the state reached after step t. For a truncated step that is the
value of the episode's *final* observation (not the first observation of the next episode); for the
last step of a rollout it is the value of the state the rollout stopped in.

The tests compare `buffers.kernels` against these loops; `bench/bench_kernels.py` times both.
"""

import numpy as np


def gae(rewards, values, next_values, terminated, episode_end, gamma, lam):
    """Generalized Advantage Estimation (Schulman et al. 2016), cut at episode ends.

    delta_t = r_t + gamma * (1 - terminated_t) * next_values_t - values_t
    A_t     = delta_t + gamma * lam * (1 - episode_end_t) * A_{t+1},   A_T = 0

    Returns ``(advantages, returns)`` with ``returns = advantages + values``, in the dtype of ``rewards``.
    """
    T, B = rewards.shape
    advantages = np.zeros((T, B), dtype=rewards.dtype)
    for b in range(B):
        next_advantage = 0.0
        for t in reversed(range(T)):
            not_terminated = 0.0 if terminated[t, b] else 1.0
            not_end = 0.0 if episode_end[t, b] else 1.0
            delta = rewards[t, b] + gamma * not_terminated * next_values[t, b] - values[t, b]
            next_advantage = delta + gamma * lam * not_end * next_advantage
            advantages[t, b] = next_advantage
    return advantages, (advantages + values).astype(rewards.dtype)


def td_lambda(rewards, next_values, terminated, episode_end, gamma, lam):
    """TD(lambda) returns (the targets of COMA and QMIX), cut at episode ends.

    G_t = r_t + gamma * (1 - terminated_t) * [(1 - lam) * V_{t+1} + lam * G_{t+1}]

    where V_{t+1} = next_values_t, and G_{t+1} is replaced by V_{t+1} when step t ends an episode
    or is the last step of the rollout (there is no G_{t+1} to follow).
    """
    T, B = rewards.shape
    returns = np.zeros((T, B), dtype=rewards.dtype)
    for b in range(B):
        for t in reversed(range(T)):
            not_terminated = 0.0 if terminated[t, b] else 1.0
            if episode_end[t, b] or t == T - 1:
                future = next_values[t, b]
            else:
                future = (1.0 - lam) * next_values[t, b] + lam * returns[t + 1, b]
            returns[t, b] = rewards[t, b] + gamma * not_terminated * future
    return returns


def discounted_returns(rewards, next_values, terminated, episode_end, gamma):
    """Discounted returns G_t = r_t + gamma * (1 - terminated_t) * G_{t+1}, cut at episode ends.

    After a truncated step or the last step of the rollout, G_{t+1} is the bootstrap value
    ``next_values[t]`` (pass zeros for pure Monte Carlo returns). Equal to ``td_lambda`` with lam=1.
    """
    T, B = rewards.shape
    returns = np.zeros((T, B), dtype=rewards.dtype)
    for b in range(B):
        for t in reversed(range(T)):
            not_terminated = 0.0 if terminated[t, b] else 1.0
            if episode_end[t, b] or t == T - 1:
                future = next_values[t, b]
            else:
                future = returns[t + 1, b]
            returns[t, b] = rewards[t, b] + gamma * not_terminated * future
    return returns


def nstep_returns(rewards, terminated, episode_end, gamma, n):
    """Pieces of the n-step target  y_t = R_t + D_t * V(next state of step K_t)  (DQN-style).

    For each t the window is m = min(n, T - t, steps to the end of t's episode) steps long:

    * ``R_t = sum_{k<m} gamma^k r_{t+k}``  -- the discounted reward sum (dtype of ``rewards``);
    * ``D_t = gamma^m``, or 0 if the window's last step terminated -- the bootstrap discount;
    * ``K_t = t + m - 1`` (int64)          -- the step whose *next* observation bootstraps.

    Returns ``(R, D, K)``.
    """
    T, B = rewards.shape
    reward_sums = np.zeros((T, B), dtype=rewards.dtype)
    discounts = np.zeros((T, B), dtype=rewards.dtype)
    last_steps = np.zeros((T, B), dtype=np.int64)
    for b in range(B):
        for t in range(T):
            total, scale, k = 0.0, 1.0, t
            while True:
                total += scale * rewards[k, b]
                scale *= gamma
                if episode_end[k, b] or k == T - 1 or k - t + 1 == n:
                    break
                k += 1
            reward_sums[t, b] = total
            discounts[t, b] = 0.0 if terminated[k, b] else scale
            last_steps[t, b] = k
    return reward_sums, discounts, last_steps


def neighbour_mean_actions(positions, alive, actions, n_actions, radius=None):
    """The mean one-hot action of each agent's neighbours (mean-field MARL, Yang et al. 2018), (E, A, n_actions).

    positions (E, A, 2) grid cells (None: no positions, every agent is everyone's neighbour), alive (E, A),
    actions (E, A) integers. Agent k is a neighbour of agent i when both are alive, k != i, and their Euclidean
    distance is at most `radius` (MAgent2's circular view range; None: every other living agent). An agent with no
    neighbour (or a dead one) gets zeros.
    """
    actions = np.asarray(actions)
    E, A = actions.shape
    out = np.zeros((E, A, n_actions), np.float32)
    for e in range(E):
        for i in range(A):
            if not alive[e, i]:
                continue
            neighbours = []
            for k in range(A):
                if k == i or not alive[e, k]:
                    continue
                if radius is not None and positions is not None:
                    dx, dy = positions[e, k, 0] - positions[e, i, 0], positions[e, k, 1] - positions[e, i, 1]
                    if dx * dx + dy * dy > radius * radius:
                        continue
                neighbours.append(actions[e, k])
            for a in neighbours:
                out[e, i, a] += 1.0 / len(neighbours)
    return out
