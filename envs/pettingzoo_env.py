"""PettingZoo parallel envs behind the `VecEnv` contract, stepped in this process.

The pieces, shared with the subprocess version in `envs/subproc.py`:

* `describe(env)` reads one env's agents and spaces once and fixes the layout: the groups (agents
  with the same role prefix and identical spaces, in the env's agent order), their observation,
  action and action-mask shapes, and where the global state comes from.
* `StepArrays` preallocates every batched array a step produces, `(E, ...)` each: the next and the
  final `Observation`, rewards, terminated, truncated, done, and the actions to apply. It can live
  in ordinary memory or be laid over one shared-memory block.
* `EnvRunner` owns one env and writes row `i` of those arrays: it turns the array actions into the
  env's action dict, fills observations agent by agent, zeroes and masks dead agents, keeps the
  episode returns and auto-resets a finished env (copying its last row to `final` first).
* `PettingZooVecEnv` validates actions and hands back copies of the buffers as a `StepResult`;
  `SyncVecEnv` steps its runners one after another.

Conventions (see also `envs/api.py`):

* An agent that terminates is dead from that step on: zero observation, `agent_mask` False,
  `terminated` True, reward 0 after the step it died in, and its actions are never sent to the env.
  Action masks of dead agents are all True so a masked softmax stays finite.
* An env whose agents have all terminated or been truncated is reset inside `step`. Its row of
  `StepResult.final` holds the observation and state that step reached (surviving agents keep their
  real observation, so a time-limit truncation can bootstrap from it); `next` holds the first
  observation of the new episode. Where no env finished, `final` is the very same object as `next`.
* Env i is reset with `seed + i` by `reset()`; auto-resets pass no seed, so each env continues its
  own random generator and a run is a deterministic function of the seed.
* Global state: the env's own `state()` where it exists and works, else the flattened observations
  of all agents, concatenated in group order then agent order (for mpe2 this equals `state()`).
"""

import dataclasses
import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gymnasium import spaces

from envs.api import EpisodeStats, GroupSpec, Observation, StepResult, VecEnv, check_actions

_AGENT_SUFFIX = re.compile(r"_\d+$")
_ALIGN = 64  # byte alignment of each array carved out of a shared block


def role_of(agent: str) -> str:
    """The role of an agent id: the id without its trailing `_<n>` (`adversary_2` -> `adversary`)."""
    return _AGENT_SUFFIX.sub("", agent)


@dataclass(frozen=True)
class EnvSpec:
    """Everything fixed about one env that the vector env needs to lay out its arrays.

    groups        name -> GroupSpec, in the env's agent order
    agents        (agent id, group index, index within the group), in the env's agent order
    mask_source   per group: "obs" (Dict observation with an action_mask), "info" (infos[agent]
                  ["action_mask"]) or None
    action_start  per group: the Discrete space's `start` (0 almost always), added before sending
    state_from_env  True: state is env.state(); False: the concatenated observations
    """

    groups: dict[str, GroupSpec]
    agents: tuple[tuple[str, int, int], ...]
    mask_source: tuple[str | None, ...]
    action_start: tuple[int, ...]
    state_shape: tuple[int, ...]
    state_dtype: np.dtype
    state_from_env: bool
    max_steps: int | None
    render_fps: int | None


def _find_attr(env, name: str):
    """Look up `name` on the env, then on its unwrapped core and the game object inside that
    (PettingZoo wrappers hide some attributes; Butterfly keeps its settings on `raw_env.env`)."""
    core = getattr(env, "unwrapped", None)
    for obj in (env, core, getattr(core, "env", None)):
        try:
            value = getattr(obj, name)
        except Exception:  # some wrappers raise on unknown attributes instead of AttributeError
            continue
        if value is not None:
            return value
    return None


def _float32_if_64(dtype) -> np.dtype:
    """Networks train in float32: float64 observations/states are stored as float32."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype == np.float64 else dtype


def describe(env, seed: int, state_from_obs: bool = False) -> EnvSpec:
    """Reset `env` with `seed` and read its groups, spaces and state layout.

    Args:
        env: a PettingZoo parallel env.
        seed: the seed of the probing reset (the vector env reseeds before its first step anyway).
        state_from_obs: skip `env.state()` and use the concatenated observations (for envs whose
            state is known to be exactly that, so it is not computed twice).
    """
    agents = list(env.possible_agents)
    _, infos = env.reset(seed=seed)
    infos = infos or {}

    # Group agents: same role prefix and identical observation and action spaces.
    members: list[list[str]] = []
    keys: list[tuple] = []
    for agent in agents:
        key = (role_of(agent), env.observation_space(agent), env.action_space(agent))
        for g, other in enumerate(keys):
            if other == key:
                members[g].append(agent)
                break
        else:
            keys.append(key)
            members.append([agent])

    groups: dict[str, GroupSpec] = {}
    mask_source: list[str | None] = []
    action_start: list[int] = []
    seen_roles: dict[str, int] = {}
    for (role, obs_space, act_space), group_agents in zip(keys, members, strict=True):
        # Same role but different spaces (rare): a second group gets a suffix.
        seen_roles[role] = seen_roles.get(role, 0) + 1
        name = role if seen_roles[role] == 1 else f"{role}_g{seen_roles[role]}"

        source = None
        if isinstance(obs_space, spaces.Dict) and {"observation", "action_mask"} <= set(obs_space.spaces):
            source, obs_space = "obs", obs_space["observation"]
        elif any(isinstance(infos.get(a), dict) and "action_mask" in infos[a] for a in group_agents):
            source = "info"
        if not isinstance(obs_space, spaces.Box):
            raise NotImplementedError(
                f"group {name!r}: observation space {obs_space} is not supported "
                "(use Box, or Dict(observation=Box, action_mask=...))"
            )

        if isinstance(act_space, spaces.Discrete):
            discrete, action_dim, low, high = True, int(act_space.n), None, None
            action_start.append(int(act_space.start))
        elif isinstance(act_space, spaces.Box) and len(act_space.shape) == 1:
            discrete, action_dim = False, int(act_space.shape[0])
            low = act_space.low.astype(np.float32)
            high = act_space.high.astype(np.float32)
            action_start.append(0)
        else:
            raise NotImplementedError(
                f"group {name!r}: action space {act_space} is not supported (Discrete or 1-D Box)"
            )
        mask_source.append(source)
        groups[name] = GroupSpec(
            name=name,
            agents=tuple(group_agents),
            obs_shape=tuple(obs_space.shape),
            obs_dtype=_float32_if_64(obs_space.dtype),
            discrete=discrete,
            action_dim=action_dim,
            action_low=low,
            action_high=high,
            has_action_mask=source is not None,
        )

    if grid_world(env) is not None:  # MAgent2: every agent has a cell on the map
        groups = {name: dataclasses.replace(spec, has_positions=True) for name, spec in groups.items()}
    index = {a: (g, j) for g, group_agents in enumerate(members) for j, a in enumerate(group_agents)}
    state = None
    if not state_from_obs:
        try:
            state = env.state()
        except Exception:  # not implemented, or broken for this env: fall back to observations
            state = None
    if isinstance(state, np.ndarray) and state.size > 0:
        state_shape, state_dtype, from_env = tuple(state.shape), _float32_if_64(state.dtype), True
    else:
        size = sum(spec.n_agents * math.prod(spec.obs_shape) for spec in groups.values())
        dtype = np.result_type(*(spec.obs_dtype for spec in groups.values()))
        state_shape, state_dtype, from_env = (size,), np.dtype(dtype), False

    max_steps = _find_attr(env, "max_cycles")
    fps = (getattr(env, "metadata", None) or {}).get("render_fps")
    return EnvSpec(
        groups=groups,
        agents=tuple((a, *index[a]) for a in agents),
        mask_source=tuple(mask_source),
        action_start=tuple(action_start),
        state_shape=state_shape,
        state_dtype=state_dtype,
        state_from_env=from_env,
        max_steps=int(max_steps) if max_steps is not None else None,
        render_fps=int(fps) if fps else None,
    )


def grid_world(env):
    """The MAgent2 engine (a GridWorld with team handles) behind a PettingZoo env, else None."""
    core = getattr(env, "unwrapped", env)
    world = getattr(core, "env", None)
    return world if hasattr(world, "get_pos") and hasattr(core, "handles") else None


class StepArrays:
    """Every batched array of a vector env, preallocated once: `(E, ...)` each.

    next, final  Observation of full batch arrays (obs, state, agent_mask, avail_actions)
    rewards[g] (E, A) float32, terminated[g] (E, A) bool, truncated (E,) bool, done (E,) bool
    actions[g]   (E, A) int64 or (E, A, d) float32: what the next step applies

    With `memory` (a writable buffer of at least `StepArrays.nbytes(...)` bytes, e.g. a
    multiprocessing RawArray) the arrays are views into it, so processes that map the same block
    see each other's writes.
    """

    def __init__(self, spec: EnvSpec, num_envs: int, memory=None):
        arrays = {}
        offset = 0
        for key, shape, dtype in self.layout(spec, num_envs):
            if memory is None:
                arrays[key] = np.zeros(shape, dtype)
                continue
            count = math.prod(shape)
            arrays[key] = np.frombuffer(memory, dtype=dtype, count=count, offset=offset).reshape(shape)
            offset += -(-count * dtype.itemsize // _ALIGN) * _ALIGN
        names = list(spec.groups)
        masked = [g for g, s in spec.groups.items() if s.has_action_mask]
        placed = [g for g, s in spec.groups.items() if s.has_positions]

        def observation(prefix: str) -> Observation:
            return Observation(
                obs={g: arrays[f"{prefix}/obs/{g}"] for g in names},
                state=arrays[f"{prefix}/state"],
                agent_mask={g: arrays[f"{prefix}/mask/{g}"] for g in names},
                avail_actions={g: arrays[f"{prefix}/avail/{g}"] for g in masked},
                positions={g: arrays[f"{prefix}/pos/{g}"] for g in placed},
            )

        self.next = observation("next")
        self.final = observation("final")
        self.rewards = {g: arrays[f"rewards/{g}"] for g in names}
        self.terminated = {g: arrays[f"terminated/{g}"] for g in names}
        self.truncated = arrays["truncated"]
        self.done = arrays["done"]
        self.actions = {g: arrays[f"actions/{g}"] for g in names}

    @staticmethod
    def layout(spec: EnvSpec, num_envs: int) -> list[tuple[str, tuple[int, ...], np.dtype]]:
        """(key, shape, dtype) of every array, in the order they are laid out in memory."""
        E = num_envs
        fields = []
        for prefix in ("next", "final"):
            for g, s in spec.groups.items():
                fields.append((f"{prefix}/obs/{g}", (E, s.n_agents, *s.obs_shape), s.obs_dtype))
                fields.append((f"{prefix}/mask/{g}", (E, s.n_agents), np.dtype(bool)))
                if s.has_action_mask:
                    fields.append((f"{prefix}/avail/{g}", (E, s.n_agents, s.action_dim), np.dtype(bool)))
                if s.has_positions:
                    fields.append((f"{prefix}/pos/{g}", (E, s.n_agents, 2), np.dtype(np.int32)))
            fields.append((f"{prefix}/state", (E, *spec.state_shape), spec.state_dtype))
        for g, s in spec.groups.items():
            fields.append((f"rewards/{g}", (E, s.n_agents), np.dtype(np.float32)))
            fields.append((f"terminated/{g}", (E, s.n_agents), np.dtype(bool)))
            if s.discrete:
                fields.append((f"actions/{g}", (E, s.n_agents), np.dtype(np.int64)))
            else:
                fields.append((f"actions/{g}", (E, s.n_agents, s.action_dim), np.dtype(np.float32)))
        fields.append(("truncated", (E,), np.dtype(bool)))
        fields.append(("done", (E,), np.dtype(bool)))
        return [(key, tuple(shape), np.dtype(dtype)) for key, shape, dtype in fields]

    @classmethod
    def nbytes(cls, spec: EnvSpec, num_envs: int) -> int:
        """Bytes of one block holding every array (each aligned to 64 bytes)."""
        return sum(
            -(-math.prod(shape) * dtype.itemsize // _ALIGN) * _ALIGN for _, shape, dtype in cls.layout(spec, num_envs)
        )


def _copy_observation(o: Observation) -> Observation:
    return Observation(
        obs={g: a.copy() for g, a in o.obs.items()},
        state=o.state.copy(),
        agent_mask={g: a.copy() for g, a in o.agent_mask.items()},
        avail_actions={g: a.copy() for g, a in o.avail_actions.items()},
        positions={g: a.copy() for g, a in o.positions.items()},
    )


class EnvRunner:
    """Steps one PettingZoo parallel env and writes row `index` of the batch arrays in `buffers`.

    Used in-process by `SyncVecEnv` and inside each worker process by `SubprocVecEnv`, so both
    produce the same numbers. Keeps per-agent alive flags and episode returns as Python lists:
    in this per-agent loop they are cheaper than numpy scalars.
    """

    def __init__(self, env, spec: EnvSpec, buffers: StepArrays, index: int):
        self.env = env
        self.spec = spec
        self.index = index
        self.keep_final_frame = False  # set by video recording: render before an auto-reset
        self.final_frame: np.ndarray | None = None
        names = list(spec.groups)
        i = index
        # Row views: writing into them writes row i of the (E, ...) arrays.
        self._obs = [buffers.next.obs[g][i] for g in names]
        self._mask = [buffers.next.agent_mask[g][i] for g in names]
        self._avail = [buffers.next.avail_actions[g][i] if g in buffers.next.avail_actions else None for g in names]
        self._final_obs = [buffers.final.obs[g][i] for g in names]
        self._final_mask = [buffers.final.agent_mask[g][i] for g in names]
        self._final_avail = [
            buffers.final.avail_actions[g][i] if g in buffers.final.avail_actions else None for g in names
        ]
        self._state = buffers.next.state[i]
        self._final_state = buffers.final.state[i]
        self._pos = [buffers.next.positions[g][i] for g in names if g in buffers.next.positions]
        self._final_pos = [buffers.final.positions[g][i] for g in names if g in buffers.final.positions]
        self._rewards = [buffers.rewards[g][i] for g in names]
        self._terminated = [buffers.terminated[g][i] for g in names]
        self._actions = [buffers.actions[g][i] for g in names]
        self._truncated = buffers.truncated
        self._done = buffers.done
        self._discrete = [spec.groups[g].discrete for g in names]
        self._any_start = any(spec.action_start)
        self._action_rows = list(zip(self._actions, self._discrete, strict=True))
        # Slices of the concatenated-observation state, one per group.
        bounds = np.cumsum([0] + [self._obs[gi].size for gi in range(len(names))])
        slices = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        self._state_parts = [(sl, obs.reshape(-1)) for sl, obs in zip(slices, self._obs, strict=True)]
        self._state_from_env = spec.state_from_env
        # One tuple per agent, in the env's order: (its index k, id, group index, index in group,
        # mask source).
        self._agents = [(k, a, g, j, spec.mask_source[g]) for k, (a, g, j) in enumerate(spec.agents)]
        self._group_members = [[k for k, (_, g, _) in enumerate(spec.agents) if g == gi] for gi in range(len(names))]
        self._rew_lists = [[0.0] * spec.groups[g].n_agents for g in names]
        self._term_lists = [[False] * spec.groups[g].n_agents for g in names]
        self._rew_pairs = list(zip(self._rewards, self._rew_lists, strict=True))
        self._term_pairs = list(zip(self._terminated, self._term_lists, strict=True))
        n = len(self._agents)
        self._active = [False] * n  # still acting this episode
        self._dead = [False] * n  # terminated (or never present) this episode: terminated stays True
        self._returns = [0.0] * n
        self._length = 0
        self._warned_state = False
        if self._pos:  # MAgent2: engine id k is possible_agents[k]; where each id's row is
            self._world = grid_world(env)
            self._group_of_id = np.array([g for _, _, g, _, _ in self._agents])
            self._row_of_id = np.array([j for _, _, _, j, _ in self._agents])

    # --- writing one agent's observation ------------------------------------------------------

    def _write_obs(self, g: int, j: int, source: str | None, obs, info) -> None:
        avail = self._avail[g]
        if source == "obs":
            avail[j] = obs["action_mask"]
            obs = obs["observation"]
        elif source == "info":
            mask = info.get("action_mask") if isinstance(info, dict) else None
            avail[j] = True if mask is None else mask
        self._obs[g][j] = obs
        self._mask[g][j] = True

    def _clear_obs(self, g: int, j: int) -> None:
        self._obs[g][j] = 0
        self._mask[g][j] = False
        if self._avail[g] is not None:
            self._avail[g][j] = True

    def _write_state(self, finished: bool) -> None:
        if not self._state_from_env:
            for sl, obs in self._state_parts:
                self._state[sl] = obs
            return
        try:
            self._state[...] = self.env.state()
        except Exception:
            # MAgent2's state() fails once a team has no agents left. At the end of an episode
            # nothing bootstraps from it; mid-episode zeros are wrong, so say so once.
            self._state[...] = 0
            if not finished and not self._warned_state:
                warnings.warn("env.state() failed mid-episode; using a zero state", stacklevel=2)
                self._warned_state = True

    def _write_positions(self, teams=None) -> None:
        """Every living agent's cell, from the engine (`teams`: its (handle, positions) pairs, when already read);
        zeros for the dead (MAgent2 only: the groups have positions)."""
        world = self._world
        for pos in self._pos:
            pos[...] = 0
        for h, xy in teams if teams is not None else ((h, world.get_pos(h)) for h in self.env.unwrapped.handles):
            ids = world.get_agent_id(h)
            if len(ids):
                self._pos[self._group_of_id[ids[0]]][self._row_of_id[ids]] = xy

    # --- the two things a runner does ---------------------------------------------------------

    def reset(self, seed: int | None = None) -> None:
        """Reset the env (seeded, or continuing its own RNG when `seed` is None) and write row i."""
        obs, infos = self.env.reset(seed=seed)
        infos = infos or {}
        for k, agent, g, j, source in self._agents:
            o = obs.get(agent)
            if o is None:  # absent from the start: treated as dead for this episode
                self._clear_obs(g, j)
                self._active[k], self._dead[k] = False, True
            else:
                self._write_obs(g, j, source, o, infos.get(agent))
                self._active[k], self._dead[k] = True, False
            self._returns[k] = 0.0
        self._length = 0
        if self._pos:
            self._write_positions()
        self._write_state(finished=False)

    def step(self) -> EpisodeStats | None:
        """Apply this env's row of `buffers.actions`; return the episode's stats if it finished."""
        # Actions of the agents still alive only: envs such as MAgent2 reject actions for the dead.
        # Discrete rows go out as Python ints (what the envs' own arithmetic is fastest on);
        # continuous rows as a copy, so an env keeping a reference never sees the next step's.
        rows = [a.tolist() if d else a.copy() for a, d in self._action_rows]
        if self._any_start:
            rows = [[x + s for x in row] if s else row for row, s in zip(rows, self.spec.action_start, strict=True)]
        active = self._active
        actions = {agent: rows[g][j] for k, agent, g, j, _ in self._agents if active[k]}

        obs, rewards, terminations, truncations, infos = self.env.step(actions)

        # Rewards and flags go to Python lists first and into numpy once per group: one numpy
        # call per agent costs more than the whole list on this per-step path.
        obs_rows, rew_lists, term_lists = self._obs, self._rew_lists, self._term_lists
        dead, returns = self._dead, self._returns
        any_truncated = False
        n_active = 0
        for k, agent, g, j, source in self._agents:
            if not active[k]:
                rew_lists[g][j] = 0.0
                term_lists[g][j] = dead[k]
                if self._mask[g][j]:  # left by truncation in an env that goes on (rare)
                    self._clear_obs(g, j)
                continue
            r = rewards.get(agent, 0.0)
            rew_lists[g][j] = r
            returns[k] += r
            if terminations.get(agent, False):
                term_lists[g][j] = True
                self._clear_obs(g, j)
                active[k] = False
                dead[k] = True
                continue
            term_lists[g][j] = False
            o = obs.get(agent)
            if o is None:  # vanished without a flag: no observation, no more actions
                self._clear_obs(g, j)
                active[k] = False
                continue
            if source is None:
                obs_rows[g][j] = o  # its mask is already True: it is active
            else:
                self._write_obs(g, j, source, o, infos.get(agent))
            if truncations.get(agent, False):
                active[k] = False
                any_truncated = True
            else:
                n_active += 1
        for row, values in self._rew_pairs:
            row[:] = values
        for row, values in self._term_pairs:
            row[:] = values
        # An env that drops its agents list without flags ended by its own limit: a truncation.
        finished = n_active == 0 or not self.env.agents
        if finished and n_active:
            any_truncated = True
        self._length += 1
        self._write_state(finished)
        if self._pos:
            self._write_positions()
        return self._end_step(finished, any_truncated)

    def _end_step(self, finished: bool, truncated: bool) -> EpisodeStats | None:
        """Flag row i; a finished episode's last observation goes to `final`, then the env resets."""
        i = self.index
        self._truncated[i] = truncated
        self._done[i] = finished
        if not finished:
            return None
        stats = self._episode_stats()
        for g in range(len(self._obs)):
            self._final_obs[g][...] = self._obs[g]
            self._final_mask[g][...] = self._mask[g]
            if self._avail[g] is not None:
                self._final_avail[g][...] = self._avail[g]
        for pos, final in zip(self._pos, self._final_pos, strict=True):
            final[...] = pos
        self._final_state[...] = self._state
        if self.keep_final_frame:
            self.final_frame = self.env.render()
        self.reset(seed=None)
        return stats

    def _episode_stats(self) -> EpisodeStats:
        group_returns = {
            name: sum(self._returns[k] for k in members) / len(members)
            for name, members in zip(self.spec.groups, self._group_members, strict=True)
        }
        return EpisodeStats(
            env_index=self.index,
            group_returns=group_returns,
            episode_return=sum(self._returns) / len(self._returns),
            length=self._length,
        )


class PettingZooVecEnv(VecEnv):
    """What the sync and subprocess vector envs share: action checks and building results.

    Subclasses implement `_reset_envs(seed)` and `_step_envs() -> list[EpisodeStats]`, which fill
    `self._buffers`; this class copies the buffers out, so results stay valid after the next step.
    """

    def __init__(self, spec: EnvSpec, num_envs: int, seed: int, buffers: StepArrays):
        self.spec = spec
        self.groups = spec.groups
        self.num_envs = num_envs
        self.state_shape = spec.state_shape
        self.max_steps = spec.max_steps
        self.render_fps = spec.render_fps
        self.seed = seed
        self._buffers = buffers
        self._needs_reset = True
        self._closed = False

    def _reset_envs(self, seed: int) -> None:
        raise NotImplementedError

    def _step_envs(self) -> list[EpisodeStats]:
        raise NotImplementedError

    def reset(self, seed: int | None = None) -> Observation:
        """Reset every env, env i with `seed + i` (`seed=None`: the seed given to `make`)."""
        if self._closed:
            raise RuntimeError("the vector env is closed")
        self._reset_envs(self.seed if seed is None else seed)
        self._needs_reset = False
        return _copy_observation(self._buffers.next)

    def step(self, actions: dict[str, np.ndarray]) -> StepResult:
        """Step every env; finished envs are reset and their last observation goes to `final`.

        Args:
            actions: per group, `(E, A)` integers for discrete groups or `(E, A, d)` floats for
                continuous ones (clipped to the action bounds). Dead agents' actions are ignored.
        """
        if self._closed:
            raise RuntimeError("the vector env is closed")
        if self._needs_reset:
            raise RuntimeError("call reset() before the first step()")
        self._write_actions(actions)
        episodes = self._step_envs()
        b = self._buffers
        next_obs = _copy_observation(b.next)
        final = next_obs
        if episodes:  # an env finished: its row of `final` is its last observation, not `next`
            done = b.done
            final = _copy_observation(next_obs)
            for dst, src in (
                (final.obs, b.final.obs),
                (final.agent_mask, b.final.agent_mask),
                (final.avail_actions, b.final.avail_actions),
                (final.positions, b.final.positions),
            ):
                for g in dst:
                    dst[g][done] = src[g][done]
            final.state[done] = b.final.state[done]
        return StepResult(
            next=next_obs,
            rewards={g: a.copy() for g, a in b.rewards.items()},
            terminated={g: a.copy() for g, a in b.terminated.items()},
            truncated=b.truncated.copy(),
            done=b.done.copy(),
            final=final,
            episodes=episodes,
        )

    def _write_actions(self, actions: dict[str, np.ndarray]) -> None:
        """Check each group's actions (envs.api.check_actions) and copy them into the action buffer."""
        for name, a in check_actions(actions, self.groups, self.num_envs).items():
            spec, buf = self.groups[name], self._buffers.actions[name]
            if spec.discrete:
                buf[...] = a
            else:
                np.clip(a, spec.action_low, spec.action_high, out=buf, casting="unsafe")

    def close(self) -> None:
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SyncVecEnv(PettingZooVecEnv):
    """`num_envs` PettingZoo parallel envs stepped one after another in this process.

    Args:
        env_fn: builds one env (e.g. `envs.registry.env_factory("simple_spread_v3", N=3)`).
        num_envs: E.
        seed: env i is reset with `seed + i` by `reset()`.
        state_from_obs: use the concatenated observations as the state without calling `state()`.
        runner: what steps each env (`EnvRunner`; `envs.magent_native.MagentRunner` for MAgent2's engine).
    """

    def __init__(self, env_fn: Callable, num_envs: int, seed: int = 0, state_from_obs: bool = False,
                 runner: type | None = None):  # fmt: skip
        envs = [env_fn() for _ in range(num_envs)]
        spec = describe(envs[0], seed, state_from_obs)
        buffers = StepArrays(spec, num_envs)
        super().__init__(spec, num_envs, seed, buffers)
        self.runners = [(runner or EnvRunner)(env, spec, buffers, i) for i, env in enumerate(envs)]

    def _reset_envs(self, seed: int) -> None:
        for i, runner in enumerate(self.runners):
            runner.reset(seed + i)

    def _step_envs(self) -> list[EpisodeStats]:
        episodes = []
        for runner in self.runners:
            stats = runner.step()
            if stats is not None:
                episodes.append(stats)
        return episodes

    def render(self, env_index: int = 0) -> np.ndarray:
        """An `(H, W, 3)` uint8 frame of env `env_index` (the env needs `render_mode="rgb_array"`)."""
        frame = self.runners[env_index].env.render()
        if frame is None:
            raise ValueError("the env returned no frame: build it with render_mode='rgb_array'")
        return np.asarray(frame)

    def close(self) -> None:
        if self._closed:
            return
        super().close()
        for runner in self.runners:
            runner.env.close()
