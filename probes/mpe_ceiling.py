"""How much of simple_v3 is the action space? Scripted controllers on protocol v2's final episodes (issue 23).

    python probes/mpe_ceiling.py [--episodes 1000]

simple_v3 is one agent walking to one landmark: no partner, no credit to assign, so what separates two learners
there is control. mpe2 gives a discrete agent five actions, a unit force along one axis or none; a continuous agent
sets the force's two components apart, each in [-1, 1], so it can push diagonally (up to sqrt 2) and brake finely.
The probe plays a proportional-derivative controller, force ~ kp * (landmark - position) - kd * velocity, in each
action space: continuous, the force clipped per component; discrete, the unit action closest to it (none where the
wanted force is weak). It keeps the best gains of a grid, on the fixed episodes every final policy plays (env i
seeded 10000 + i). The gap between the two is what the action space alone costs a good controller; a learner is
not bound by either number, which only say what a plain controller reaches in each action space.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from envs import make  # noqa: E402
from runtime.evaluation import FINAL_SEED  # noqa: E402

ENV_ID = "simple_v3"
GAINS = list(itertools.product([1, 2, 4, 8, 16, 32, 64], [0, 0.5, 1, 2, 4, 8, 16]))


def controller(obs: np.ndarray, kp: float, kd: float, continuous: bool) -> np.ndarray:
    """Actions (E, 1, ...) for observations (E, 1, 4): [velocity (2), landmark - position (2)]."""
    velocity, offset = obs[:, 0, :2], obs[:, 0, 2:4]
    force = kp * offset - kd * velocity
    if continuous:  # mpe2's Box(5): [none, -x, +x, -y, +y], force = (a2 - a1, a4 - a3)
        fx, fy = np.clip(force[:, 0], -1, 1), np.clip(force[:, 1], -1, 1)
        actions = np.zeros((len(obs), 5), np.float32)
        actions[:, 1], actions[:, 2] = np.maximum(-fx, 0), np.maximum(fx, 0)
        actions[:, 3], actions[:, 4] = np.maximum(-fy, 0), np.maximum(fy, 0)
        return actions[:, None]
    axis = np.abs(force).argmax(1)  # Discrete(5): 0 none, 1 -x, 2 +x, 3 -y, 4 +y
    positive = force[np.arange(len(obs)), axis] > 0
    return np.where(np.abs(force).max(1) > 0.5, 1 + 2 * axis + positive, 0)[:, None]


def play(kp: float, kd: float, continuous: bool, episodes: int) -> float:
    """Mean episode return of the controller over `episodes` episodes (env i seeded FINAL_SEED + i)."""
    env = make(ENV_ID, num_envs=episodes, seed=FINAL_SEED, backend="numba", continuous_actions=continuous)
    try:
        obs, returns, over = env.reset(), np.zeros(episodes), np.zeros(episodes, bool)
        while not over.all():
            step = env.step({"agent": controller(obs.obs["agent"], kp, kd, continuous)})
            returns += np.where(over, 0.0, step.rewards["agent"][:, 0])
            over |= step.done
            obs = step.next
        return float(returns.mean())
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1000, help="episodes per setting (default 1000)")
    args = parser.parse_args()
    if args.episodes < 1:
        parser.error(f"--episodes {args.episodes}: must be >= 1")
    for continuous in (False, True):
        score, kp, kd = max((play(kp, kd, continuous, args.episodes), kp, kd) for kp, kd in GAINS)
        print(f"{ENV_ID} {'continuous' if continuous else 'discrete'}: {score:.2f} (kp {kp}, kd {kd})")


if __name__ == "__main__":
    main()
