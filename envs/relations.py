"""Relations between the entities an agent observes: what `--relations` adds to every multi-agent script's inputs.

On simple_spread_v3 a landmark pays only its nearest agent, so what should decide an agent's move is, for each
landmark, whether it is nearer than every other agent: N (N - 1) distances and N minima, which a plain MLP must learn
to compute from raw coordinates in a fixed input order. At N = 3 it does; at N = 6 MAPPO stands still near the no-op
policy, and the same MAPPO given these numbers reaches the scripted controller's level
(results/simple_spread_v3/agents.md, "The diagnosis"). `WithRelations` appends them to each agent's observation,
computed from that observation alone:

    for each landmark l:  d_il = |l - i|  and  m_il = min over the other agents j that i sees of |l - j|

So a policy trained on them still acts from its own observation (the evaluations and the opponents' envs carry them
too, computed from the original env's observations), and the state gains every agent's relations after its own.

The env declares where its observations hold which entities (`GroupSpec.entities`: (kind, offset, count), each entity
a position relative to the agent, two numbers from `offset` on). `LAYOUTS` declares them per env id, for every backend
of that id (envs.make fills them in); an env without a declaration has no relations, and `--relations` says so.
"""

import dataclasses

import numpy as np

from envs.api import Observation, StepResult, VecEnv


def spread_layout(N=3, num_agent_neighbors=None, num_landmark_neighbors=None, **_):
    """simple_spread_v3: [self_vel, self_pos, landmark_rel_positions, other_agent_rel_positions, other_agent_comms];
    with num_*_neighbors an agent sees its nearest ones, in slots padded with zeros past the ones that exist."""
    landmarks, others = num_landmark_neighbors or N, num_agent_neighbors or N - 1
    return (("landmarks", 4, min(landmarks, N)), ("agents", 4 + 2 * landmarks, min(others, N - 1)))


LAYOUTS = {"simple_spread_v3": spread_layout}
"""env id -> (env kwargs -> the `GroupSpec.entities` of its agent group)."""


def declare_entities(env: VecEnv, env_id: str, env_kwargs: dict) -> VecEnv:
    """`env` with its groups' observation layouts declared (`LAYOUTS`; unchanged for other ids)."""
    if env_id in LAYOUTS:
        entities = LAYOUTS[env_id](**env_kwargs)
        env.groups = {g: dataclasses.replace(s, entities=entities) for g, s in env.groups.items()}
    return env


def relations(obs: np.ndarray, entities) -> np.ndarray:
    """(..., D) observations -> (..., 2 L): for each of the L landmarks, d_il, then for each, m_il."""
    at = {kind: (start, n) for kind, start, n in entities}
    (lm, n_lm), (ag, n_ag) = at["landmarks"], at["agents"]
    lx, ly = obs[..., lm : lm + 2 * n_lm : 2], obs[..., lm + 1 : lm + 2 * n_lm : 2]  # (..., L): relative to the agent
    ox, oy = obs[..., ag : ag + 2 * n_ag : 2], obs[..., ag + 1 : ag + 2 * n_ag : 2]  # (..., K)
    own = np.sqrt(lx * lx + ly * ly)
    dx, dy = lx[..., :, None] - ox[..., None, :], ly[..., :, None] - oy[..., None, :]  # (..., L, K): landmark - other
    nearest = np.sqrt((dx * dx + dy * dy).min(-1))  # the root of the least square: one root per landmark
    return np.concatenate([own, nearest], -1).astype(obs.dtype, copy=False)


def relation_groups(env: VecEnv, env_id: str) -> list[str]:
    """The groups `WithRelations` extends; a ValueError saying what is missing when there are none."""
    kinds = {g: {kind: n for kind, _, n in s.entities} for g, s in env.groups.items()}
    groups = [g for g, k in kinds.items() if k.get("landmarks", 0) > 0 and k.get("agents", 0) > 0]
    if not groups:
        if any(kinds.values()):
            declared = "has no landmarks or no other agents in its observations"
        else:
            declared = "declares no observation layout (envs/relations.py: LAYOUTS)"
        raise ValueError(
            f"--relations compares each landmark's distance with the other agents', and {env_id} {declared}; "
            "drop --relations"
        )
    return groups


class WithRelations(VecEnv):
    """`env` whose groups with landmarks and other agents observe `relations` after their own observation; the state
    is the env's state, then every extended group's relations, agent by agent."""

    def __init__(self, env: VecEnv, env_id: str):
        self.env, self.extended = env, relation_groups(env, env_id)
        self.groups, added = dict(env.groups), 0
        for g in self.extended:
            s = env.groups[g]
            width = 2 * next(n for kind, _, n in s.entities if kind == "landmarks")  # d_il and m_il per landmark
            self.groups[g] = dataclasses.replace(s, obs_shape=(s.obs_shape[0] + width,))
            added += s.n_agents * width
        self.state_shape = (int(np.prod(env.state_shape)) + added,)

    def __getattr__(self, name):  # num_envs, max_steps, render, close, all_groups, ...: the env's own
        return getattr(self.env, name)

    def extend(self, observation: Observation) -> Observation:
        obs, rel = dict(observation.obs), []
        for g in self.extended:
            r = relations(obs[g], self.env.groups[g].entities)
            obs[g] = np.concatenate([obs[g], r], -1)
            rel.append(r.reshape(len(r), -1))
        state = np.concatenate([observation.state.reshape(len(observation.state), -1), *rel], -1)
        return dataclasses.replace(observation, obs=obs, state=state)

    def reset(self, seed: int | None = None) -> Observation:
        return self.extend(self.env.reset(seed))

    def set_state(self, state) -> Observation:  # get_state is the env's own: the relations are computed
        return self.extend(self.env.set_state(state))

    def step(self, actions) -> StepResult:
        step = self.env.step(actions)
        after = self.extend(step.next)  # no env finished: `final` is `next` (the backends hand back one object)
        return dataclasses.replace(
            step, next=after, final=after if step.final is step.next else self.extend(step.final)
        )

    def render(self, env_index: int = 0) -> np.ndarray:
        return self.env.render(env_index)

    def close(self) -> None:
        self.env.close()
