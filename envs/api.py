"""The contract between vectorized multi-agent envs and the scripts in `algos/`.

Every backend (PettingZoo sync/subprocess, the Numba MPE) returns these types, so a script never
sees a PettingZoo dict. Arrays are batched over envs first: E envs, A agents of a group.
"""

import numbers
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class GroupSpec:
    """A set of agents with identical spaces and the same role (`agent`, `adversary`, `red`, ...)."""

    name: str
    agents: tuple[str, ...]  # the env's agent ids, in the fixed order of the A axis
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    discrete: bool
    action_dim: int  # number of actions (discrete) or size of the action vector (continuous)
    action_low: np.ndarray | None = None  # continuous only: bounds per action component
    action_high: np.ndarray | None = None
    has_action_mask: bool = False
    has_positions: bool = False  # the env places the agents on a grid (MAgent2): Observation.positions
    entities: tuple[tuple[str, int, int], ...] = ()  # (kind, offset, count): `count` positions relative to the agent,
    # two numbers each, from `offset` in its observation, e.g. ("landmarks", 4, 3) (envs/relations.py; () undeclared)

    @property
    def n_agents(self) -> int:
        return len(self.agents)


@dataclass
class Observation:
    """What the policy sees at one step, for every env.

    obs[g]            (E, A, *obs_shape)  zeros for dead agents
    state             (E, *state_shape)   the env's own `state()`, else the concatenated observations
    agent_mask[g]     (E, A) bool         alive at this step
    avail_actions[g]  (E, A, n) bool      only for groups whose env supplies action masks
    positions[g]      (E, A, 2) int32     only for grid envs (MAgent2): each agent's cell (x, y); zeros for dead agents
    """

    obs: dict[str, np.ndarray]
    state: np.ndarray
    agent_mask: dict[str, np.ndarray]
    avail_actions: dict[str, np.ndarray] = field(default_factory=dict)
    positions: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class EpisodeStats:
    """One finished episode of env `env_index`: per-group return (mean over the group's agents of each
    agent's summed reward), `episode_return` (mean over all agents), and length in steps."""

    env_index: int
    group_returns: dict[str, float]
    episode_return: float
    length: int


@dataclass
class StepResult:
    """The outcome of one `step(actions)` of every env.

    next             Observation to act on next: for a finished env, the first of its next episode
    rewards[g]       (E, A) float32
    terminated[g]    (E, A) bool   the agent's episode truly ended (no bootstrap)
    truncated        (E,)   bool   the env hit its time limit (bootstrap from `final`)
    done             (E,)   bool   the env finished an episode this step and was reset
    final            Observation reached by this step *before* any reset: equal to `next` for envs
                     that did not finish; for finished envs, their last observation/state (for bootstrapping)
    episodes         the episodes that finished this step
    """

    next: Observation
    rewards: dict[str, np.ndarray]
    terminated: dict[str, np.ndarray]
    truncated: np.ndarray
    done: np.ndarray
    final: Observation
    episodes: list[EpisodeStats]


class VecEnv:
    """What every `envs.make(...)` result provides (backends subclass this; it holds no logic).

    groups       dict[str, GroupSpec], in a fixed order (the env's agent order)
    num_envs     E
    state_shape  shape of `Observation.state` per env
    max_steps    the episode time limit (e.g. mpe2's max_cycles), or None when there is none

    reset(seed=None) -> Observation     env i is seeded with seed + i (seed=None: the seed given to make)
    step(actions)    -> StepResult      actions[g]: (E, A) int64 for discrete groups, (E, A, d) float32
                                        for continuous ones; actions of dead agents are ignored
    render(env_index=0) -> (H, W, 3) uint8 frame of one env
    close()

    Optional (the Numba MPE has them; runtime.run saves them in last.pt, so a resume is exact):
    get_state()      -> dict of numpy arrays: everything the next steps depend on, random streams included
    set_state(state) -> Observation     put it back into an env of the same id, flags and num_envs
    """

    groups: dict[str, GroupSpec]
    num_envs: int
    state_shape: tuple[int, ...]
    max_steps: int | None

    def reset(self, seed: int | None = None) -> Observation:
        raise NotImplementedError

    def step(self, actions: dict[str, np.ndarray]) -> StepResult:
        raise NotImplementedError

    def render(self, env_index: int = 0) -> np.ndarray:
        raise NotImplementedError

    def close(self) -> None:
        pass


def unexpected_arguments(env_id: str, given, accepted) -> str | None:
    """The sentence every backend refuses keyword arguments with, or None when `given` holds only `accepted` ones."""
    unexpected = sorted(set(given) - set(accepted))
    if not unexpected:
        return None
    return f"{env_id} got unexpected argument(s) {', '.join(unexpected)}; it accepts: {', '.join(sorted(accepted))}"


def mistyped_argument(env_id: str, given: dict, defaults: dict) -> str | None:
    """The sentence for the first keyword argument whose value is not of its default's kind (`defaults`: name -> a
    default value or a type): true or false for a flag, a whole number for a count, a number for a rate; and N and
    max_cycles at least 1 (N=0 failed deep in the env's construction). None when every value fits."""
    for name, value in given.items():
        default = defaults.get(name)
        kind = default if isinstance(default, type) else type(default)
        if kind is bool and not isinstance(value, bool):
            expected = "true or false"
        elif kind is int and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            expected = "a whole number"
        elif kind is float and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
            expected = "a number"
        elif name in ("N", "max_cycles") and isinstance(value, numbers.Integral) and value < 1:
            expected = "at least 1"
        else:
            continue
        return f"{env_id}'s {name} must be {expected}, got {value!r}"
    return None


def refused_arguments(env_id: str, given: dict, defaults: dict) -> str | None:
    """Why a backend refuses keyword arguments (`defaults`: what it accepts, name -> default value or type): one it
    does not take, else one of the wrong kind; None when it takes them all."""
    return unexpected_arguments(env_id, given, defaults) or mistyped_argument(env_id, given, defaults)


def check_actions(actions: dict, groups: dict[str, GroupSpec], num_envs: int) -> dict[str, np.ndarray]:
    """The actions `step` takes, checked as every backend checks them; returns group -> array.

    Per group: `(E, A)` integers in `[0, action_dim)` for discrete groups, `(E, A, d)` finite numbers for continuous
    ones (which the backend then clips to the action bounds). Anything else raises ValueError naming the group, what
    was given and what was expected. The cost is one or two reductions per group.
    """
    if not isinstance(actions, dict):
        raise ValueError(f"actions must be a dict group -> array over the groups {list(groups)}")
    if len(actions) != len(groups) and (extra := sorted(set(actions) - set(groups))):
        raise ValueError(f"actions has unknown group(s) {extra}; the groups are {list(groups)}")
    arrays = {}
    for name, spec in groups.items():
        if name not in actions:
            raise ValueError(f"actions is missing group {name!r}; the groups are {list(groups)}")
        a = actions[name]
        a = a if isinstance(a, np.ndarray) else np.asarray(a)
        if spec.discrete:
            shape = (num_envs, spec.n_agents)
            what = f"(num_envs, n_agents) = {shape} integers in [0, {spec.action_dim})"
            if a.shape != shape or a.dtype.kind not in "iu":
                got = f"shape {a.shape}" if a.shape != shape else f"dtype {a.dtype}"
                raise ValueError(f"actions[{name!r}] has {got}; expected {what}")
            # one reduction checks both ends: negative int64 values are huge as uint64
            if a.dtype == np.int64:
                bad = a.view(np.uint64).max() >= spec.action_dim
            else:
                bad = a.min() < 0 or a.max() >= spec.action_dim
            if bad:
                raise ValueError(f"actions[{name!r}] has values in [{a.min()}, {a.max()}]; expected {what}")
        else:
            shape = (num_envs, spec.n_agents, spec.action_dim)
            what = f"(num_envs, n_agents, action_dim) = {shape} finite floats"
            if a.shape != shape or a.dtype.kind not in "fiu":
                got = f"shape {a.shape}" if a.shape != shape else f"dtype {a.dtype}"
                raise ValueError(f"actions[{name!r}] has {got}; expected {what}")
            if a.dtype.kind == "f" and not np.isfinite(a.sum()) and not np.isfinite(a).all():
                raise ValueError(f"actions[{name!r}] holds NaN or infinite values; expected {what}")
        arrays[name] = a
    return arrays
