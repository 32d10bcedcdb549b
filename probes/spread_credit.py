"""Is credit assignment what stops MAPPO on simple_spread_v3 at N agents (issue 46)? mappo.py, unchanged, trained on
difference rewards: the same run with each agent's share of the team's reward replaced by what that agent adds to it.

    python probes/spread_credit.py --env-kwargs '{"N": 6}' --total-timesteps 3000000 --run-dir /tmp/credit6
    python probes/spread_credit.py --reward assigned --env-kwargs '{"N": 6}' --total-timesteps 3000000 --run-dir ...
    (any mappo.py flag; --env-id is simple_spread_v3)

mpe2's simple_spread gives agent i the reward r_i = (1 - c) G + c L_i, with the team's term G = -sum over landmarks of
the distance to the nearest agent, its own collisions L_i and c = local_ratio = 0.5. Every agent shares G, so the
advantage that trains agent i's action is mostly the other N - 1 agents' doing, a noise that grows with N. The
difference reward (Wolpert and Tumer 2002) replaces G by D_i = G - G_{-i}, with G_{-i} the same sum over the agents
but i: the change agent i makes to G, with the others where they are. G_{-i} does not depend on agent i's actions
(save through collisions), so an action that raises D_i raises G by as much: the agents are paid for the same team
objective, each on its own part of it. Training reads the shaped rewards (its logged episode returns are theirs);
evaluation, the periodic and the final one, plays mpe2's own env and its own reward (protocol v2), like every row.

If the shaped run reaches the scripted controller's level where the plain one stands still, credit assignment is the
obstacle; if it stands still too, the obstacle is elsewhere.

`--reward assigned` is a denser oracle: the team term replaced by N times agent i's own distance to the landmark the
scripted controller would send it to (the one-to-one assignment of least total distance, recomputed every step), so
every agent, not only the one nearest a landmark, is paid for every step it closes in. It asks whether the networks
and the optimizer can learn the coordinated behaviour when the reward points at it: if they can, the obstacle is the
task's reward (a landmark pays only its nearest agent, so the others learn nothing from approaching it), not what the
policy can represent.

`--reward nearest` is the sanity check below both: each agent paid for closing in on its own nearest landmark, a
function of its own observation alone (the least of N distances) that ignores the others. A learner that cannot
learn even this at N agents has a problem that is neither credit nor coordination.
"""

import sys
from pathlib import Path

import numpy as np
from scipy.optimize import linear_sum_assignment

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "algos"))
sys.path.insert(0, str(ROOT / "probes"))

import mappo  # noqa: E402  (the checkout's own script)
from spread_levels import distances  # noqa: E402

from runtime import cli  # noqa: E402

LOCAL_RATIO = 0.5  # mpe2 simple_spread_v3's default
REWARD = "difference"  # --reward


def team_terms(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(E, N, 6N) observations -> G (E,) and G_{-i} (E, N): minus the summed distance of each landmark to its nearest
    agent, with every agent, and with every agent but i."""
    dist = distances(obs)[1]
    team = -dist.min(1).sum(-1)
    without = np.stack([-np.delete(dist, i, axis=1).min(1).sum(-1) for i in range(dist.shape[1])], axis=1)
    return team, without


def assigned_distances(obs: np.ndarray) -> np.ndarray:
    """(E, N, 6N) observations -> (E, N): each agent's distance to its landmark under the one-to-one assignment of
    least total distance (the scripted controller's, probes/spread_levels.py)."""
    dist = distances(obs)[1]
    return np.stack([d[np.arange(len(d)), linear_sum_assignment(d)[1]] for d in dist])


class ShapedRewards:
    """The training env, each agent's r_i = (1 - c) G + c L_i turned into (1 - c) D_i + c L_i = r_i - (1 - c) G_{-i}
    (`difference`), or into -(1 - c) N d_i + c L_i with d_i agent i's distance to its assigned landmark (`assigned`)
    or to its nearest landmark (`nearest`)."""

    def __init__(self, env, reward: str = "difference"):
        self.env, self.reward = env, reward

    def __getattr__(self, name):
        return getattr(self.env, name)

    def step(self, actions):
        step = self.env.step(actions)
        for g, r in step.rewards.items():
            final = step.final.obs[g]  # the state this step reached, before any reset
            team, without = team_terms(final)
            collisions = r - (1 - LOCAL_RATIO) * team[:, None]
            if self.reward == "difference":
                shaped = r - (1 - LOCAL_RATIO) * without
            elif self.reward == "assigned":
                shaped = collisions - (1 - LOCAL_RATIO) * final.shape[1] * assigned_distances(final)
            else:  # nearest
                shaped = collisions - (1 - LOCAL_RATIO) * final.shape[1] * distances(final)[1].min(-1)
            step.rewards[g] = shaped.astype(r.dtype)
        return step


def make_shaped_env(args, num_envs, seed, **kwargs):
    return ShapedRewards(ORIGINAL_MAKE_ENV(args, num_envs, seed, **kwargs), REWARD)


ORIGINAL_MAKE_ENV = mappo.make_env

if __name__ == "__main__":
    if any(a.startswith("--env-id") or a.startswith("--env_id") for a in sys.argv[1:]):
        sys.exit("error: this probe trains on simple_spread_v3 only; drop --env-id")
    if "--reward" in sys.argv:  # this probe's own flag, before mappo.py's
        at = sys.argv.index("--reward")
        REWARD = sys.argv[at + 1] if at + 1 < len(sys.argv) else ""
        del sys.argv[at : at + 2]
    if REWARD not in ("difference", "assigned", "nearest"):
        sys.exit(f"error: --reward {REWARD!r}: expected difference, assigned or nearest")
    sys.argv[1:1] = ["--env-id", "simple_spread_v3"]
    mappo.make_env = make_shaped_env  # only mappo.main's training env: evaluation builds its own, unshaped
    cli(mappo.Args, mappo.main)
