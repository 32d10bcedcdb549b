"""Why do the value-based scripts learn Foraging-2s-8x8-2p-2f-coop at their defaults, and not Foraging-8x8-2p-2f-coop
(issue 42)? iql.py unchanged, its agents reading every other entity's position relative to their own, in training and
in every evaluation alike (the change of frame is the network's first step).

    python probes/foraging_inputs.py --env-id Foraging-8x8-2p-2f-coop --total-timesteps 2000000 \
        --eval-episodes 100 --eval-interval 50000 --run-dir /tmp/egocentric
    (any iql.py flag; the env must be a Level-Based Foraging task)

An LBF observation lists (row, col, level) of the foods in sight, then of the agent itself, then of the other players
in sight, relative to the corner of the agent's sight window, clipped at the field's edge; (-1, -1, 0) for one out of
sight. With sight 2 (`-2s`) the corner sits two cells up and left of the agent wherever the field allows, so a food
next to it reads (1-3, 1-3) almost everywhere: the observation is nearly egocentric, and "a food beside me: load" is
nearly a fixed pattern of the inputs. With the whole field in sight the corner is the field's own: positions are
absolute (0-7), and whether a food is beside the agent is |row - my row| + |col - my col| = 1, a comparison of
inputs that a Linear-ReLU encoder must learn for every cell (the PPO scripts learn this task; the value-based ones,
with fewer gradient steps per sample, do not in 2M).

This probe keeps the full view and its information and changes only the frame: every food and other player as
(row - my row, col - my col, level), (0, 0, 0) where none (no food or other player shares the agent's cell, so it is
unambiguous), the agent itself as it was (where it stands: the field's edges). If the plain script learns nothing
where this run learns, the absolute frame is the obstacle (the relations between entities, as for simple_spread at
6 agents: results/simple_spread_v3/agents.md); if it learns nothing either, the obstacle is elsewhere.
"""

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "algos"))

import iql  # noqa: E402  (the checkout's own script)

from runtime import cli  # noqa: E402

ABSOLUTE_FORWARD = iql.GroupQ.forward


def egocentric(obs: torch.Tensor) -> torch.Tensor:
    """(..., A, 3 (F + A)) LBF observations of A players and F foods -> the same with every food and other player at
    its offset from the agent, (0, 0, 0) where none; the agent's own triple (index F) unchanged."""
    x = obs.unflatten(-1, (-1, 3))  # (..., A, F + A, 3)
    me = obs.shape[-1] // 3 - obs.shape[-2]  # the agent's own triple follows the F foods'
    offsets = torch.cat([x[..., :2] - x[..., me : me + 1, :2], x[..., 2:]], -1) * (x[..., 2:] > 0)
    own = torch.arange(x.shape[-2], device=obs.device) == me
    return torch.where(own[:, None], x, offsets).flatten(-2)


def egocentric_forward(self, obs, h=None):
    """GroupQ's forward on egocentric observations: training, acting, evaluation and a reloaded checkpoint."""
    return ABSOLUTE_FORWARD(self, egocentric(obs), h)


if __name__ == "__main__":
    env_ids = [sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a in ("--env-id", "--env_id")]
    if not env_ids or not env_ids[-1].startswith("Foraging-"):
        sys.exit("error: this probe reads Level-Based Foraging observations: give --env-id Foraging-8x8-2p-2f-coop (or "
                 "another Foraging task)")  # fmt: skip
    iql.GroupQ.forward = egocentric_forward
    cli(iql.Args, iql.main)
