"""Is what the networks must compute what stops MAPPO on simple_spread_v3 at N agents (issue 46)? mappo.py, unchanged,
on observations that carry the relations a policy needs, already computed.

    python probes/spread_inputs.py --env-kwargs '{"N": 6}' --total-timesteps 3000000 --run-dir /tmp/inputs6
    (any mappo.py flag; --env-id is simple_spread_v3)

A landmark pays only its nearest agent, so an agent's move toward landmark l is worth something only if no other
agent is nearer l: the policy must compare, for every landmark, its own distance with every other agent's, N (N - 1)
distances and N minima from 4N - 2 raw coordinates, in a plain MLP whose input order is fixed. The critic must do the
same for all N agents. This probe appends to each agent's observation, for each landmark l, its own distance d_il and
the distance of the nearest other agent m_il = min over j != i of |x_l - x_j| (2N numbers), and builds the state from
the extended observations. The features are a fixed function of what the agent already sees, so they are part of the
policy: the evaluations (protocol v2, mpe2's own env and reward) see them too.

If MAPPO reaches the scripted controller's level with them where it stands still without, the obstacle is what the
networks must compute from raw coordinates, and an encoder that computes relations (attention over the entities)
is the fix to build; if it stands still with them too, the obstacle is elsewhere.
"""

import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "algos"))
sys.path.insert(0, str(ROOT / "probes"))

import mappo  # noqa: E402  (the checkout's own script)
from spread_levels import distances  # noqa: E402

import runtime.run  # noqa: E402
from runtime import cli  # noqa: E402


def relations(obs: np.ndarray) -> np.ndarray:
    """(E, N, 6N) observations -> (E, N, 2N): for agent i and landmark l, d_il and min over j != i of d_jl."""
    dist = distances(obs)[1]  # (E, agents, landmarks)
    N = dist.shape[1]
    others = np.stack([np.delete(dist, i, axis=1).min(1) for i in range(N)], axis=1) if N > 1 else dist * np.inf
    return np.concatenate([dist, others], -1).astype(obs.dtype)


class WithRelations:
    """An env whose observations carry `relations`, and whose state is the extended observations, concatenated."""

    def __init__(self, env):
        self.env = env
        self.groups = {
            g: dataclasses.replace(s, obs_shape=(s.obs_shape[0] + 2 * s.n_agents,)) for g, s in env.groups.items()
        }
        self.state_shape = (sum(s.n_agents * s.obs_shape[0] for s in self.groups.values()),)

    def __getattr__(self, name):
        return getattr(self.env, name)

    def extend(self, observation):
        obs = {g: np.concatenate([o, relations(o)], -1) for g, o in observation.obs.items()}
        state = np.concatenate([o.reshape(len(o), -1) for o in obs.values()], -1)
        return dataclasses.replace(observation, obs=obs, state=state)

    def reset(self, *args, **kwargs):
        return self.extend(self.env.reset(*args, **kwargs))

    def step(self, actions):
        step = self.env.step(actions)
        return dataclasses.replace(step, next=self.extend(step.next), final=self.extend(step.final))


if __name__ == "__main__":
    if any(a.startswith("--env-id") or a.startswith("--env_id") for a in sys.argv[1:]):
        sys.exit("error: this probe trains on simple_spread_v3 only; drop --env-id")
    sys.argv[1:1] = ["--env-id", "simple_spread_v3"]
    make_env, make_eval_env = mappo.make_env, runtime.run.standard_eval_env
    mappo.make_env = lambda *a, **k: WithRelations(make_env(*a, **k))  # the training env
    runtime.run.standard_eval_env = lambda *a, **k: WithRelations(make_eval_env(*a, **k))  # protocol v2's, extended
    cli(mappo.Args, mappo.main)
