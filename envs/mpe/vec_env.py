"""`MPEVecEnv`: E mpe2 worlds behind the `envs.api.VecEnv` contract, stepped by one compiled call.

Memory: the worlds live in a `WorldState` that only the kernels touch. Every `step` allocates
fresh output arrays (observations/state (E, S), rewards, flags) and the kernel writes straight into
them, so what a caller holds is never overwritten by a later step and nothing is copied twice.
`Observation.obs[g]` and `StepResult.rewards[g]` are views of those fresh arrays (one group's
columns); `agent_mask` arrays are shared read-only constants (MPE agents never die). When no env
finished, `final` is the same object as `next`.
"""

from __future__ import annotations

import numpy as np

from envs.api import EpisodeStats, GroupSpec, Observation, StepResult, VecEnv, check_actions, refused_arguments
from envs.mpe.kernels import observe_envs, reset_envs, step_envs
from envs.mpe.physics import WorldSpec, new_world_state
from envs.mpe.scenarios import COMMON_KWARGS, SCENARIOS, Layout, Scenario, build_spec


def find_scenario(env_id: str) -> Scenario:
    """The scenario for an id such as "simple_spread_v3", "mpe2/simple_spread_v3" or "simple_spread"."""
    name = env_id.replace(":", "/").replace(".", "/").rsplit("/", 1)[-1]
    if name in SCENARIOS:
        return SCENARIOS[name]
    matches = [s for s in SCENARIOS.values() if s.name.rsplit("_", 1)[0] == name]
    if len(matches) == 1:
        return matches[0]
    raise ValueError(f"unknown MPE scenario {env_id!r}; known: {', '.join(SCENARIOS)}")


def resolve_kwargs(scenario: Scenario, kwargs: dict) -> dict:
    """mpe2's keyword arguments with its defaults filled in; unknown or unsupported ones raise."""
    allowed = scenario.defaults()
    if refusal := refused_arguments(scenario.name, kwargs, allowed):
        raise TypeError(refusal)
    resolved = {**allowed, **kwargs}
    if resolved["benchmark_data"]:
        raise NotImplementedError("the numba MPE backend has no benchmark_data=True: use --backend pettingzoo")
    return resolved


def build_world(scenario: Scenario, kwargs: dict) -> tuple[Layout, WorldSpec]:
    """The scenario's Layout and WorldSpec for fully resolved keyword arguments."""
    own = {k: kwargs[k] for k in scenario.kwargs}
    layout = scenario.build(**own)
    return layout, build_spec(scenario, layout, bool(kwargs["continuous_actions"]))


def agent_groups(names: list[str]) -> dict[str, list[int]]:
    """Agent indices by role, the agent id without its trailing `_<index>`; groups in agent order."""
    groups: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        groups.setdefault(name.rsplit("_", 1)[0], []).append(i)
    for g, idx in groups.items():
        if idx != list(range(idx[0], idx[-1] + 1)):
            raise AssertionError(f"group {g} is not contiguous in the agent order")
    return groups


def seed_states(seed: int, num_envs: int) -> np.ndarray:
    """Initial SplitMix64 states: env i is seeded with seed + i through numpy's SeedSequence."""
    return np.array(
        [np.random.SeedSequence(seed + i).generate_state(1, np.uint64)[0] for i in range(num_envs)],
        dtype=np.uint64,
    )


class MPEVecEnv(VecEnv):
    """`num_envs` copies of one mpe2 scenario, stepped together by `envs.mpe.kernels.step_envs`.

    Same agents, groups (by agent-id prefix, in mpe2's agent order), spaces, physics, rewards,
    observations and reset distributions as the mpe2 environment built with the same keyword
    arguments. `state` is mpe2's `state()`: all agents' observations concatenated in agent order.
    Episodes end by truncation at `max_cycles` (or success, with terminate_on_success=True) and
    are reset inside `step`.
    """

    def __init__(self, env_id: str, num_envs: int = 1, seed: int = 0, autoreset: bool = True, **env_kwargs):
        if num_envs < 1:
            raise ValueError("num_envs must be at least 1")
        self.scenario = find_scenario(env_id)
        self.env_kwargs = resolve_kwargs(self.scenario, env_kwargs)
        self.layout, self.spec = build_world(self.scenario, self.env_kwargs)
        self.num_envs = num_envs
        self.max_steps = int(self.env_kwargs["max_cycles"])
        self.continuous = bool(self.env_kwargs["continuous_actions"])
        self.autoreset = autoreset
        self.agents = [a.name for a in self.layout.agents]
        self.obs_dims = list(self.layout.obs_dims)
        offsets = self.spec.obs_offset
        self.state_shape = (int(offsets[-1]),)

        self._group_index = agent_groups(self.agents)
        self.groups: dict[str, GroupSpec] = {}
        self._group_slices: dict[str, tuple[slice, slice, int, int]] = {}
        for g, idx in self._group_index.items():
            dims = {self.obs_dims[i] for i in idx}
            n_act = {int(self.spec.n_actions[i]) for i in idx}
            if len(dims) != 1 or len(n_act) != 1:
                raise AssertionError(f"agents of group {g} differ in their spaces")
            d, n = dims.pop(), n_act.pop()
            self.groups[g] = GroupSpec(
                name=g,
                agents=tuple(self.agents[i] for i in idx),
                obs_shape=(d,),
                obs_dtype=np.dtype(np.float32),
                discrete=not self.continuous,
                action_dim=n,
                action_low=np.zeros(n, np.float32) if self.continuous else None,
                action_high=np.ones(n, np.float32) if self.continuous else None,
            )
            agents = slice(idx[0], idx[-1] + 1)
            columns = slice(int(offsets[idx[0]]), int(offsets[idx[-1] + 1]))
            self._group_slices[g] = (agents, columns, len(idx), d)

        E, A = num_envs, len(self.agents)
        self._world = new_world_state(self.spec, E)
        self._seed = 0 if seed is None else int(seed)
        self._seeded = False
        # action staging: groups' arrays are copied into one (E, A[, D]) array per step
        self._act_i = np.zeros((E, A), np.int64)
        self._act_f = np.zeros((E, A, int(self.spec.n_actions.max()) if self.continuous else 0), np.float32)
        self._final_buf = np.zeros((E, self.state_shape[0]), np.float32)
        self._ep_return = np.zeros((E, A))
        self._ep_length = np.zeros(E, np.int64)
        self._masks = {}
        for g, (_, _, n, _) in self._group_slices.items():
            mask = np.ones((E, n), np.bool_)
            mask.flags.writeable = False
            self._masks[g] = mask
        self._renderer = None
        self._closed, self._needs_reset = False, True

    # --- the VecEnv contract ---------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> Observation:
        """Reset every env; env i is seeded with seed + i. seed=None: the seed given to `make` on the
        first reset, afterwards each env's random stream simply continues."""
        if self._closed:
            raise RuntimeError("the vector env is closed")
        self._needs_reset = False
        if seed is not None or not self._seeded:
            self._world.rng[:] = seed_states(self._seed if seed is None else int(seed), self.num_envs)
            self._seeded = True
        state = np.empty((self.num_envs, self.state_shape[0]), np.float32)
        reset_envs(self.spec, self._world, np.arange(self.num_envs), state)
        return self._observation(state)

    def step(self, actions: dict[str, np.ndarray]) -> StepResult:
        """Step every env; actions as the PettingZoo backend takes them (envs.api.check_actions), continuous
        ones clipped to the action bounds [0, 1]."""
        if self._closed:
            raise RuntimeError("the vector env is closed")
        if self._needs_reset:
            raise RuntimeError("call reset() before the first step()")
        return self._step(check_actions(actions, self.groups, self.num_envs))

    def _step(self, actions: dict[str, np.ndarray]) -> StepResult:
        """`step` without the checks of its input (bench/bench_numba_mpe.py measures what they cost)."""
        E, A = self.num_envs, len(self.agents)
        for g, a in actions.items():
            agents = self._group_slices[g][0]
            if self.continuous:
                d = self.groups[g].action_dim
                np.clip(a, 0.0, 1.0, out=self._act_f[:, agents, :d], casting="unsafe")
            else:
                self._act_i[:, agents] = a
        state = np.empty((E, self.state_shape[0]), np.float32)
        rewards = np.empty((E, A), np.float32)
        terminated = np.empty((E, A), np.bool_)
        truncated = np.empty(E, np.bool_)
        done = np.empty(E, np.bool_)
        bad = step_envs(
            self.spec,
            self._world,
            self._act_i,
            self._act_f,
            self.max_steps,
            self.autoreset,
            state,
            self._final_buf,
            rewards,
            terminated,
            truncated,
            done,
            self._ep_return,
            self._ep_length,
        )
        if bad >= 0:
            raise ValueError(f"env {bad}: discrete action out of range {self._act_i[bad].tolist()}")
        nxt = self._observation(state)
        episodes: list[EpisodeStats] = []
        final = nxt
        if self.autoreset and done.any():
            finished = np.flatnonzero(done)
            final_state = state.copy()
            final_state[finished] = self._final_buf[finished]
            final = self._observation(final_state)
            episodes = self._episode_stats(finished)
        return StepResult(
            next=nxt,
            rewards={g: rewards[:, agents] for g, (agents, _, _, _) in self._group_slices.items()},
            terminated={g: terminated[:, agents] for g, (agents, _, _, _) in self._group_slices.items()},
            truncated=truncated,
            done=done,
            final=final,
            episodes=episodes,
        )

    def render(self, env_index: int = 0) -> np.ndarray:
        """(700, 700, 3) uint8 frame of env `env_index`, drawn by mpe2's own renderer."""
        from envs.mpe.mpe2_bridge import Renderer

        if self._renderer is None:
            self._renderer = Renderer(self.scenario.name, self.env_kwargs)
        return self._renderer.render(self.get_world(env_index))

    def close(self) -> None:
        self._closed = True
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    # --- beyond the contract: inspect and set worlds (tests, rendering) ---------------------------

    def get_world(self, env_index: int) -> dict[str, np.ndarray]:
        """Copies of env `env_index`'s world: pos (N, 2), vel (N, 2), comm (A, dim_c), goal (G,),
        steps, cam_range (see `WorldState`)."""
        w = self._world
        return {
            "pos": w.pos[env_index].copy(),
            "vel": w.vel[env_index].copy(),
            "comm": w.comm[env_index].copy(),
            "goal": w.goal[env_index].copy(),
            "steps": int(w.steps[env_index]),
            "cam_range": float(w.cam_range[env_index]),
        }

    def set_world(self, env_index: int, pos, vel, comm, goal, new_episode: bool = True) -> None:
        """Overwrite env `env_index`'s world (e.g. with an mpe2 world's state); `new_episode` also
        zeroes its step count and return, as a reset does. Call `observe()` for its observations."""
        w = self._world
        w.pos[env_index] = pos
        w.vel[env_index] = vel
        w.comm[env_index] = comm
        w.goal[env_index] = goal
        if new_episode:
            w.steps[env_index] = 0
            w.ep_return[env_index] = 0.0
            w.cam_range[env_index] = np.abs(w.pos[env_index]).max()

    def get_state(self) -> dict[str, np.ndarray]:
        """Copies of everything the next steps depend on: every world's arrays (random streams included) and the
        episodes' running returns and lengths. `set_state` puts them back: a run stopped and resumed steps on as if
        it never stopped (runtime.run saves it in last.pt)."""
        return {k: v.copy() for k, v in self._state_arrays().items()}

    def set_state(self, state: dict[str, np.ndarray]) -> Observation:
        """Put back what `get_state` returned (of an env with the same id, flags and num_envs); returns the
        observations the env had then."""
        arrays = self._state_arrays()
        if set(state) != set(arrays) or any(np.shape(state[k]) != v.shape for k, v in arrays.items()):
            raise ValueError(f"the saved env state does not fit this {self.scenario.name} env of {self.num_envs} "
                             f"envs: saved with other env flags or another --num-envs")  # fmt: skip
        for k, v in arrays.items():
            v[...] = state[k]
        self._seeded, self._needs_reset = True, False
        return self.observe()

    def _state_arrays(self) -> dict[str, np.ndarray]:
        """The arrays `get_state` copies and `set_state` writes, by name (the live ones)."""
        arrays = {f"world.{k}": v for k, v in self._world._asdict().items()}
        return arrays | {"ep_return": self._ep_return, "ep_length": self._ep_length}

    def observe(self) -> Observation:
        """The current observations of every env (what the last reset/step returned as `next`)."""
        state = np.empty((self.num_envs, self.state_shape[0]), np.float32)
        observe_envs(self.spec, self._world, state)
        return self._observation(state)

    # --- helpers ---------------------------------------------------------------------------------

    def _observation(self, state: np.ndarray) -> Observation:
        E = self.num_envs
        obs = {g: state[:, cols].reshape(E, n, d) for g, (_, cols, n, d) in self._group_slices.items()}
        return Observation(obs=obs, state=state, agent_mask=self._masks)

    def _episode_stats(self, finished: np.ndarray) -> list[EpisodeStats]:
        returns = self._ep_return[finished]  # (F, A)
        names = list(self._group_slices)
        per_group = np.stack([returns[:, sl[0]].mean(axis=1) for sl in self._group_slices.values()], axis=1)
        group_returns = [dict(zip(names, row, strict=True)) for row in per_group.tolist()]
        totals = returns.mean(axis=1).tolist()
        lengths = self._ep_length[finished].tolist()
        # positional construction: with E = 1024 lockstep envs this list is built every max_cycles steps
        return [
            EpisodeStats(e, g, r, n)
            for e, g, r, n in zip(finished.tolist(), group_returns, totals, lengths, strict=True)
        ]


def make_vec(env_id: str, num_envs: int = 1, seed: int = 0, **env_kwargs) -> MPEVecEnv:
    """`num_envs` Numba-stepped copies of the mpe2 environment `env_id` (e.g. "simple_spread_v3").

    `env_kwargs` are mpe2's own keyword arguments (N, local_ratio, max_cycles, continuous_actions,
    num_good, ...) with mpe2's defaults. Not supported: curriculum=True, benchmark_data=True.
    """
    return MPEVecEnv(env_id, num_envs=num_envs, seed=seed, **env_kwargs)


__all__ = ["MPEVecEnv", "make_vec", "find_scenario", "COMMON_KWARGS"]
