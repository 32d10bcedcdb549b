"""The nine mpe2 scenarios: their worlds (Python), rewards and observations (Numba).

For each scenario this module holds, in the order of the mpe2 scenario file it mirrors:

* a builder that turns the scenario's keyword arguments (the same names and defaults as mpe2's
  `raw_env`) into a `Layout`: the agents and landmarks of `Scenario.make_world`, and the width of
  every agent's observation;
* `reward_<name>(spec, world, rew)`: every agent's reward in every env after a step
  (`Scenario.reward`, mixed with `Scenario.global_reward` by `local_ratio` where mpe2 does);
* `observe_<name>(spec, world, envs, out, scratch)`: every agent's observation in the listed
  envs, written into the env's float32 row of `out` at `spec.obs_offset[i]`
  (`Scenario.observation`, concatenated in agent order: mpe2's `state()`).

Like `envs.mpe.physics`, each function loops over the envs itself (passing the spec and world
tuples to a call per env would cost a reference-count update for every array they hold).

`reset_worlds` is shared (`envs.mpe.physics`): every scenario draws uniform positions and uniform
goal indices; what differs is the ranges and `WorldSpec.goal_choices`, whose per-env draws live
in `WorldState.goal`:

    simple_reference_v3         goal = [landmark agent_1 must reach, landmark agent_0 must reach]
    simple_speaker_listener_v4  goal = [the listener's target landmark]
    simple_adversary_v3         goal = [the target landmark]
    simple_push_v3              goal = [the target landmark]
    simple_crypto_v3            goal = [the message (goal landmark), the private key]

Colors enter observations only through these goals and are constants here.
`rewards`, `observe` and `terminals` at the bottom dispatch on `spec.scenario`, once per batch.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import njit

from envs.mpe.physics import N_MOVES, WorldSpec, dist, dist2, touching

SIMPLE, SPREAD, REFERENCE, SPEAKER_LISTENER, ADVERSARY, TAG, PUSH, CRYPTO, WORLD_COMM = range(9)


# --- the world of a scenario, as Python data --------------------------------------------------------


@dataclass(frozen=True)
class Body:
    """One agent or landmark of `make_world` (mpe2's Entity defaults)."""

    name: str
    size: float = 0.05
    movable: bool = True
    collide: bool = True
    silent: bool = False  # agents only
    accel: float | None = None
    max_speed: float | None = None


@dataclass
class Layout:
    """What a scenario's builder returns: the world, each agent's observation width, its options."""

    agents: list[Body]
    landmarks: list[Body]
    dim_c: int
    obs_dims: list[int]
    n_adversaries: int = 0
    n_obstacles: int = 0
    n_food: int = 0
    n_forests: int = 0
    local_ratio: float | None = None
    agent_neighbors: int | None = None
    landmark_neighbors: int | None = None
    terminate_on_success: bool = False
    agent_range: float = 1.0
    landmark_range: float = 1.0
    goal_choices: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Scenario:
    """An mpe2 environment: its id, its keyword arguments with mpe2's defaults, its builder."""

    name: str  # the mpe2 module name, e.g. "simple_spread_v3"
    sid: int
    kwargs: dict[str, Any]  # scenario-specific keyword arguments and their defaults
    build: Callable[..., Layout]

    def defaults(self) -> dict[str, Any]:
        return {**COMMON_KWARGS, **self.kwargs}


# Every mpe2 raw_env accepts these.
COMMON_KWARGS = {
    "max_cycles": 25,
    "continuous_actions": False,
    "render_mode": None,
    "dynamic_rescaling": True,
    "benchmark_data": False,
}


def build_spec(scenario: Scenario, layout: Layout, continuous: bool) -> WorldSpec:
    """Freeze a Layout into the arrays the compiled code reads."""
    bodies = layout.agents + layout.landmarks
    n_actions = []
    for a in layout.agents:  # SimpleEnv.__init__'s action spaces
        if continuous:
            n = (N_MOVES if a.movable else 0) + (0 if a.silent else layout.dim_c)
        else:
            n = (N_MOVES if a.movable else 1) * (1 if a.silent else layout.dim_c)
        n_actions.append(n)
    return WorldSpec(
        scenario=scenario.sid,
        n_agents=len(layout.agents),
        n_landmarks=len(layout.landmarks),
        dim_c=layout.dim_c,
        continuous=bool(continuous),
        n_adversaries=layout.n_adversaries,
        n_obstacles=layout.n_obstacles,
        n_food=layout.n_food,
        n_forests=layout.n_forests,
        local_ratio=np.nan if layout.local_ratio is None else float(layout.local_ratio),
        agent_neighbors=layout.agent_neighbors or 0,
        landmark_neighbors=layout.landmark_neighbors or 0,
        terminate_on_success=bool(layout.terminate_on_success),
        agent_range=float(layout.agent_range),
        landmark_range=float(layout.landmark_range),
        size=np.array([b.size for b in bodies], np.float64),
        movable=np.array([b.movable for b in bodies], np.bool_),
        collide=np.array([b.collide for b in bodies], np.bool_),
        max_speed=np.array([np.inf if b.max_speed is None else b.max_speed for b in bodies], np.float64),
        sensitivity=np.array([5.0 if a.accel is None else a.accel for a in layout.agents], np.float64),
        silent=np.array([a.silent for a in layout.agents], np.bool_),
        n_actions=np.array(n_actions, np.int64),
        obs_offset=np.concatenate([[0], np.cumsum(layout.obs_dims)]).astype(np.int64),
        goal_choices=np.array(layout.goal_choices, np.int64).reshape(-1),
    )


def _check_neighbors(**counts):
    for name, n in counts.items():
        if n is not None and (not isinstance(n, int) or n <= 0):
            raise ValueError(f"{name} must be a positive integer or None, got {n!r}")


def _no_curriculum(curriculum):
    if curriculum:
        raise NotImplementedError(
            "curriculum=True is not implemented by the numba MPE backend; use backend='pettingzoo'"
        )


# --- shared compiled helpers -------------------------------------------------------------------------
# inline="always" (here and for physics.dist & co.): inlined into the loops that call them, their
# array arguments need no reference counting per call, which made observations ~4x faster.


@njit(cache=True, inline="always")
def put2(out, k, x, y):
    """Write (x, y) at out[k:k+2] (float64 -> float32, like mpe2's .astype) and return k + 2."""
    out[k] = x
    out[k + 1] = y
    return k + 2


@njit(cache=True, inline="always")
def put_rel(out, k, pos, j, i):
    """Entity j's position relative to entity i: p_j - p_i."""
    return put2(out, k, pos[j, 0] - pos[i, 0], pos[j, 1] - pos[i, 1])


@njit(cache=True, inline="always")
def select(pos, i, first, count, skip, n, sel, d):
    """Entities first..first+count-1 (without `skip`) that entity i observes, into sel; their number.

    n == 0: all of them, in order (full observability). n > 0: the n nearest, closest first,
    ties in entity order (mpe2's nearest_entities: np.argsort, stable for so few items).
    """
    m = 0
    for j in range(first, first + count):
        if j != skip:
            sel[m] = j
            m += 1
    if n == 0:
        return m
    for a in range(m):
        d[a] = dist(pos, sel[a], i)
    for a in range(1, m):  # stable insertion sort by distance
        sj = sel[a]
        dj = d[a]
        b = a - 1
        while b >= 0 and d[b] > dj:
            sel[b + 1] = sel[b]
            d[b + 1] = d[b]
            b -= 1
        sel[b + 1] = sj
        d[b + 1] = dj
    return min(m, n)


@njit(cache=True, inline="always")
def put_selected_rel(out, k, pos, i, sel, m, width):
    """Relative positions of sel[:m] seen from i, zero-padded to `width` slots."""
    for s in range(m):
        k = put_rel(out, k, pos, sel[s], i)
    for _ in range(m, width):
        k = put2(out, k, 0.0, 0.0)
    return k


@njit(cache=True, inline="always")
def bound_penalty(x):
    """simple_tag / simple_world_comm `bound`: the price of leaving the screen at |coordinate| x."""
    if x < 0.9:
        return 0.0
    if x < 1.0:
        return (x - 0.9) * 10
    return min(math.exp(2 * x - 2), 10.0)


# --- simple_v3: one agent, one landmark --------------------------------------------------------------


def build_simple() -> Layout:
    return Layout(
        agents=[Body("agent_0", collide=False, silent=True)],
        landmarks=[Body("landmark 0", movable=False, collide=False)],
        dim_c=0,
        obs_dims=[4],
    )


@njit(cache=True)
def reward_simple(spec, world, rew):
    for e in range(rew.shape[0]):
        rew[e, 0] = -dist2(world.pos[e], 0, 1)  # squared distance to the landmark


@njit(cache=True)
def observe_simple(spec, world, envs, out, scratch):
    for e in envs:
        pos, vel, row = world.pos[e], world.vel[e], out[e]
        k = put2(row, 0, vel[0, 0], vel[0, 1])
        put_rel(row, k, pos, 1, 0)  # [self_vel, landmark_rel_position]


# --- simple_spread_v3: N agents cover N landmarks ---------------------------------------------------


def build_spread(
    N=3,
    local_ratio=0.5,
    curriculum=False,
    terminate_on_success=False,
    num_agent_neighbors=None,
    num_landmark_neighbors=None,
) -> Layout:
    if not 0.0 <= local_ratio <= 1.0:
        raise ValueError("local_ratio is a proportion. Must be between 0 and 1.")
    _check_neighbors(num_agent_neighbors=num_agent_neighbors, num_landmark_neighbors=num_landmark_neighbors)
    _no_curriculum(curriculum)
    n_lm = num_landmark_neighbors or N
    n_ag = num_agent_neighbors or N - 1
    return Layout(
        agents=[Body(f"agent_{i}", size=0.15, silent=True) for i in range(N)],
        landmarks=[Body(f"landmark {i}", movable=False, collide=False) for i in range(N)],
        dim_c=2,
        obs_dims=[4 + 2 * n_lm + 2 * n_ag + 2 * n_ag] * N,
        local_ratio=local_ratio,
        agent_neighbors=num_agent_neighbors,
        landmark_neighbors=num_landmark_neighbors,
        terminate_on_success=terminate_on_success,
    )


@njit(cache=True)
def reward_spread(spec, world, rew):
    # global: -sum over landmarks of the distance of the closest agent;
    # local: -1 for every other agent this one overlaps
    n, lr, size = spec.n_agents, spec.local_ratio, spec.size
    for e in range(rew.shape[0]):
        pos = world.pos[e]
        glob = 0.0
        for j in range(spec.n_landmarks):
            closest = np.inf
            for a in range(n):
                closest = min(closest, dist(pos, a, n + j))
            glob -= closest
        for i in range(n):
            local = 0.0
            if spec.collide[i]:
                for a in range(n):
                    if a != i and touching(size, pos, a, i):
                        local -= 1.0
            rew[e, i] = glob * (1 - lr) + local * lr


@njit(cache=True)
def observe_spread(spec, world, envs, out, scratch):
    # [self_vel, self_pos, landmark_rel_positions, other_agent_rel_positions, other_agent_comms]
    n, nl, na = spec.n_agents, spec.landmark_neighbors, spec.agent_neighbors
    sel, d = scratch.sel, scratch.dist
    for e in envs:
        pos, vel, comm, row = world.pos[e], world.vel[e], world.comm[e], out[e]
        for i in range(n):
            k = put2(row, spec.obs_offset[i], vel[i, 0], vel[i, 1])
            k = put2(row, k, pos[i, 0], pos[i, 1])
            m = select(pos, i, n, spec.n_landmarks, -1, nl, sel, d)
            k = put_selected_rel(row, k, pos, i, sel, m, nl if nl > 0 else m)
            m = select(pos, i, 0, n, i, na, sel, d)
            width = na if na > 0 else m
            k = put_selected_rel(row, k, pos, i, sel, m, width)
            for s in range(width):  # the same agents' utterances, zero-padded
                for c in range(spec.dim_c):
                    row[k] = comm[sel[s], c] if s < m else 0.0
                    k += 1


@njit(cache=True)
def terminal_spread(spec, world, flags):
    # every landmark has an agent within the capture radius 0.1
    n = spec.n_agents
    for e in range(flags.shape[0]):
        pos = world.pos[e]
        covered = True
        for j in range(spec.n_landmarks):
            closest = np.inf
            for a in range(n):
                closest = min(closest, dist(pos, a, n + j))
            covered = covered and closest < 0.1
        flags[e] = covered


# --- simple_reference_v3: two agents, each knows the other's goal, talk about it ----------------------

REFERENCE_COLORS = np.array([[0.75, 0.25, 0.25], [0.25, 0.75, 0.25], [0.25, 0.25, 0.75]])


def build_reference(local_ratio=0.5) -> Layout:
    if not 0.0 <= local_ratio <= 1.0:
        raise ValueError("local_ratio is a proportion. Must be between 0 and 1.")
    return Layout(
        agents=[Body(f"agent_{i}", collide=False) for i in range(2)],
        landmarks=[Body(f"landmark {i}", movable=False, collide=False) for i in range(3)],
        dim_c=10,
        obs_dims=[21, 21],
        local_ratio=local_ratio,
        goal_choices=[3, 3],
    )


@njit(cache=True)
def reward_reference(spec, world, rew):
    # agent i is judged by how close the *other* agent is to landmark goal[i]; global = the mean
    lr = spec.local_ratio
    for e in range(rew.shape[0]):
        pos = world.pos[e]
        glob = 0.0
        for i in range(2):
            rew[e, i] = -dist(pos, 1 - i, 2 + world.goal[e, i])
            glob += rew[e, i]
        glob /= 2
        for i in range(2):
            rew[e, i] = glob * (1 - lr) + rew[e, i] * lr


@njit(cache=True)
def observe_reference(spec, world, envs, out, scratch):
    # [self_vel, landmark_rel_positions, goal_color (the landmark for the other agent), other_comm]
    for e in envs:
        pos, vel, comm, row = world.pos[e], world.vel[e], world.comm[e], out[e]
        for i in range(2):
            k = put2(row, spec.obs_offset[i], vel[i, 0], vel[i, 1])
            for j in range(3):
                k = put_rel(row, k, pos, 2 + j, i)
            for c in range(3):
                row[k + c] = REFERENCE_COLORS[world.goal[e, i], c]
            k += 3
            for c in range(spec.dim_c):
                row[k + c] = comm[1 - i, c]


# --- simple_speaker_listener_v4: a still speaker guides a mute listener -------------------------------

SPEAKER_LISTENER_COLORS = np.array([[0.65, 0.15, 0.15], [0.15, 0.65, 0.15], [0.15, 0.15, 0.65]])


def build_speaker_listener() -> Layout:
    return Layout(
        agents=[
            Body("speaker_0", size=0.075, movable=False, collide=False),
            Body("listener_0", size=0.075, collide=False, silent=True),
        ],
        landmarks=[Body(f"landmark {i}", size=0.04, movable=False, collide=False) for i in range(3)],
        dim_c=3,
        obs_dims=[3, 11],
        goal_choices=[3],
    )


@njit(cache=True)
def reward_speaker_listener(spec, world, rew):
    for e in range(rew.shape[0]):
        r = -dist2(world.pos[e], 1, 2 + world.goal[e, 0])  # listener to the goal landmark, squared
        rew[e, 0] = r
        rew[e, 1] = r


@njit(cache=True)
def observe_speaker_listener(spec, world, envs, out, scratch):
    for e in envs:
        pos, vel, comm, row = world.pos[e], world.vel[e], world.comm[e], out[e]
        for c in range(3):  # speaker: [goal_color]
            row[c] = SPEAKER_LISTENER_COLORS[world.goal[e, 0], c]
        k = put2(row, 3, vel[1, 0], vel[1, 1])  # listener: [self_vel, landmark_rel_positions, speaker_comm]
        for j in range(3):
            k = put_rel(row, k, pos, 2 + j, 1)
        for c in range(spec.dim_c):
            row[k + c] = comm[0, c]


# --- simple_adversary_v3: N good agents hide the goal landmark from one adversary --------------------


def build_adversary(N=2, num_agent_neighbors=None, num_landmark_neighbors=None) -> Layout:
    _check_neighbors(num_agent_neighbors=num_agent_neighbors, num_landmark_neighbors=num_landmark_neighbors)
    n_lm = num_landmark_neighbors or N
    n_ag = num_agent_neighbors or N
    agents = [Body("adversary_0", size=0.15, collide=False, silent=True)]
    agents += [Body(f"agent_{i}", size=0.15, collide=False, silent=True) for i in range(N)]
    return Layout(
        agents=agents,
        landmarks=[Body(f"landmark {i}", size=0.08, movable=False, collide=False) for i in range(N)],
        dim_c=2,
        obs_dims=[2 * n_lm + 2 * n_ag] + [2 + 2 * n_lm + 2 * n_ag] * N,
        n_adversaries=1,
        agent_neighbors=num_agent_neighbors,
        landmark_neighbors=num_landmark_neighbors,
        goal_choices=[N],
    )


@njit(cache=True)
def reward_adversary(spec, world, rew):
    # adversary: -distance to the goal; good agents: (closest good agent's -distance) + adversary's
    n, n_adv = spec.n_agents, spec.n_adversaries
    for e in range(rew.shape[0]):
        pos = world.pos[e]
        goal = n + world.goal[e, 0]
        adv_rew = 0.0
        for a in range(n_adv):
            adv_rew += dist(pos, a, goal)
        closest = np.inf
        for a in range(n_adv, n):
            closest = min(closest, dist(pos, a, goal))
        for i in range(n):
            rew[e, i] = -dist(pos, i, goal) if i < n_adv else -closest + adv_rew


@njit(cache=True)
def observe_adversary(spec, world, envs, out, scratch):
    # good: [goal_rel_position, landmark_rel_positions, other_agent_rel_positions]
    # adversary: [landmark_rel_positions, other_agent_rel_positions] (it does not know the goal)
    n, nl, na = spec.n_agents, spec.landmark_neighbors, spec.agent_neighbors
    sel, d = scratch.sel, scratch.dist
    for e in envs:
        pos, row = world.pos[e], out[e]
        for i in range(n):
            k = spec.obs_offset[i]
            if i >= spec.n_adversaries:
                k = put_rel(row, k, pos, n + world.goal[e, 0], i)
            m = select(pos, i, n, spec.n_landmarks, -1, nl, sel, d)
            k = put_selected_rel(row, k, pos, i, sel, m, nl if nl > 0 else m)
            m = select(pos, i, 0, n, i, na, sel, d)
            put_selected_rel(row, k, pos, i, sel, m, na if na > 0 else m)


# --- simple_tag_v3: slow adversaries chase fast good agents around obstacles -------------------------


def build_tag(
    num_good=1,
    num_adversaries=3,
    num_obstacles=2,
    curriculum=False,
    terminate_on_success=False,
    num_agent_neighbors=None,
    num_landmark_neighbors=None,
) -> Layout:
    _check_neighbors(num_agent_neighbors=num_agent_neighbors, num_landmark_neighbors=num_landmark_neighbors)
    _no_curriculum(curriculum)
    agents = [Body(f"adversary_{i}", size=0.075, silent=True, accel=3.0, max_speed=1.0) for i in range(num_adversaries)]
    agents += [Body(f"agent_{i}", size=0.05, silent=True, accel=4.0, max_speed=1.3) for i in range(num_good)]
    n_lm = num_landmark_neighbors or num_obstacles
    n_ag = num_agent_neighbors or len(agents) - 1
    obs_dims = []
    for i in range(len(agents)):
        good_others = num_good - (0 if i < num_adversaries else 1)
        n_vel = num_agent_neighbors or good_others  # PO: one velocity slot per observed agent
        obs_dims.append(4 + 2 * n_lm + 2 * n_ag + 2 * n_vel)
    return Layout(
        agents=agents,
        landmarks=[Body(f"landmark {i}", size=0.2, movable=False) for i in range(num_obstacles)],
        dim_c=2,
        obs_dims=obs_dims,
        n_adversaries=num_adversaries,
        n_obstacles=num_obstacles,
        agent_neighbors=num_agent_neighbors,
        landmark_neighbors=num_landmark_neighbors,
        terminate_on_success=terminate_on_success,
        landmark_range=0.9,
    )


@njit(cache=True)
def adversary_contacts(size, pos, n_adv, n):
    """(good, adversary) pairs in contact: the catches shared by the adversaries of tag and world_comm."""
    catches = 0
    for g in range(n_adv, n):
        catches += touched_by_adversaries(size, pos, n_adv, g)
    return catches


@njit(cache=True)
def touched_by_adversaries(size, pos, n_adv, i):
    """How many adversaries touch agent i."""
    count = 0
    for a in range(n_adv):
        if touching(size, pos, a, i):
            count += 1
    return count


@njit(cache=True)
def reward_tag(spec, world, rew):
    # adversaries share +10 per (good, adversary) contact; a good agent pays 10 per adversary
    # touching it and the bound penalty for leaving the screen
    n, n_adv, size = spec.n_agents, spec.n_adversaries, spec.size
    for e in range(rew.shape[0]):
        pos = world.pos[e]
        catches = adversary_contacts(size, pos, n_adv, n)
        for i in range(n):
            if i < n_adv:
                rew[e, i] = 10.0 * catches
            else:
                r = -10.0 * touched_by_adversaries(size, pos, n_adv, i)
                for p in range(2):
                    r -= bound_penalty(abs(pos[i, p]))
                rew[e, i] = r


@njit(cache=True)
def observe_tag(spec, world, envs, out, scratch):
    # [self_vel, self_pos, landmark_rel_positions, other_agent_rel_positions, good_agent_velocities]
    n, n_adv = spec.n_agents, spec.n_adversaries
    nl, na = spec.landmark_neighbors, spec.agent_neighbors
    sel, d = scratch.sel, scratch.dist
    for e in envs:
        pos, vel, row = world.pos[e], world.vel[e], out[e]
        for i in range(n):
            k = put2(row, spec.obs_offset[i], vel[i, 0], vel[i, 1])
            k = put2(row, k, pos[i, 0], pos[i, 1])
            m = select(pos, i, n, spec.n_landmarks, -1, nl, sel, d)
            k = put_selected_rel(row, k, pos, i, sel, m, nl if nl > 0 else m)
            m = select(pos, i, 0, n, i, na, sel, d)
            k = put_selected_rel(row, k, pos, i, sel, m, na if na > 0 else m)
            if na == 0:  # velocities of the good agents only
                for s in range(m):
                    if sel[s] >= n_adv:
                        k = put2(row, k, vel[sel[s], 0], vel[sel[s], 1])
            else:  # one slot per observed agent: zeros for adversaries and padding
                for s in range(na):
                    if s < m and sel[s] >= n_adv:
                        k = put2(row, k, vel[sel[s], 0], vel[sel[s], 1])
                    else:
                        k = put2(row, k, 0.0, 0.0)


@njit(cache=True)
def terminal_tag(spec, world, flags):
    # every good agent is touched by some adversary
    for e in range(flags.shape[0]):
        pos = world.pos[e]
        all_caught = True
        for g in range(spec.n_adversaries, spec.n_agents):
            all_caught = all_caught and touched_by_adversaries(spec.size, pos, spec.n_adversaries, g) > 0
        flags[e] = all_caught


# --- simple_push_v3: an adversary pushes the good agent off its goal ---------------------------------


def build_push() -> Layout:
    return Layout(
        agents=[Body("adversary_0", silent=True), Body("agent_0", silent=True)],
        landmarks=[Body(f"landmark {i}", movable=False, collide=False) for i in range(2)],
        dim_c=2,
        obs_dims=[8, 19],
        n_adversaries=1,
        goal_choices=[2],
    )


@njit(cache=True)
def reward_push(spec, world, rew):
    # good: -distance to the goal; adversary: good agent's distance - its own distance to the goal
    for e in range(rew.shape[0]):
        pos = world.pos[e]
        goal = 2 + world.goal[e, 0]
        good = dist(pos, 1, goal)
        rew[e, 0] = good - dist(pos, goal, 0)
        rew[e, 1] = -good


@njit(cache=True)
def observe_push(spec, world, envs, out, scratch):
    for e in envs:
        pos, vel, row = world.pos[e], world.vel[e], out[e]
        g = world.goal[e, 0]
        # adversary: [self_vel, landmark_rel_positions, other_agent_rel_position]
        k = put2(row, 0, vel[0, 0], vel[0, 1])
        k = put_rel(row, k, pos, 2, 0)
        k = put_rel(row, k, pos, 3, 0)
        k = put_rel(row, k, pos, 1, 0)
        # good: [self_vel, goal_rel_position, own color (goal-tinted), landmark_rel_positions,
        #        landmark_colors, other_agent_rel_position]; landmark j is 0.1 gray + 0.8 in channel j+1
        k = put2(row, k, vel[1, 0], vel[1, 1])
        k = put_rel(row, k, pos, 2 + g, 1)
        for c in range(3):
            row[k + c] = 0.25 + (0.5 if c == g + 1 else 0.0)
        k += 3
        k = put_rel(row, k, pos, 2, 1)
        k = put_rel(row, k, pos, 3, 1)
        for j in range(2):
            for c in range(3):
                row[k + c] = 0.1 + (0.8 if c == j + 1 else 0.0)
            k += 3
        put_rel(row, k, pos, 0, 1)


# --- simple_crypto_v3: alice encrypts a message for bob with a shared key; eve listens ----------------
# Nobody moves. Landmark colors are one-hot vectors of size dim_c = 4: the message is the goal
# landmark's color and the key another landmark's color.


def build_crypto() -> Layout:
    names = ["eve_0", "bob_0", "alice_0"]
    return Layout(
        agents=[Body(name, movable=False, collide=False) for name in names],
        landmarks=[Body(f"landmark {i}", movable=False, collide=False) for i in range(2)],
        dim_c=4,
        obs_dims=[4, 8, 8],
        n_adversaries=1,
        goal_choices=[2, 2],  # message, key
    )


@njit(cache=True, inline="always")
def _crypto_error(comm, agent, message, dim_c):
    """Squared error of an agent's utterance against the one-hot message; 0 if it said nothing."""
    spoke = False
    err = 0.0
    for c in range(dim_c):
        x = comm[agent, c]
        spoke = spoke or x != 0.0
        t = 1.0 if c == message else 0.0
        err += (x - t) * (x - t)
    return err if spoke else 0.0


@njit(cache=True)
def reward_crypto(spec, world, rew):
    # eve: -its error; alice and bob: eve's error - bob's error
    for e in range(rew.shape[0]):
        comm = world.comm[e]
        message = world.goal[e, 0]
        eve = _crypto_error(comm, 0, message, spec.dim_c)
        bob = _crypto_error(comm, 1, message, spec.dim_c)
        rew[e, 0] = -eve
        rew[e, 1] = eve - bob
        rew[e, 2] = eve - bob


@njit(cache=True)
def observe_crypto(spec, world, envs, out, scratch):
    nc = spec.dim_c
    for e in envs:
        comm, row = world.comm[e], out[e]
        message, key = world.goal[e, 0], world.goal[e, 1]
        for c in range(nc):
            row[c] = comm[2, c]  # eve: [alice_comm]
            row[nc + c] = 1.0 if c == key else 0.0  # bob: [key, alice_comm]
            row[2 * nc + c] = comm[2, c]
            row[3 * nc + c] = 1.0 if c == message else 0.0  # alice: [message, key]
            row[4 * nc + c] = 1.0 if c == key else 0.0


# --- simple_world_comm_v3: tag with food, forests that hide, and a leader that talks ----------------
# Agents: leadadversary_0, adversary_*, agent_*. Landmarks: obstacles, then food, then forests.


def build_world_comm(num_good=2, num_adversaries=4, num_obstacles=1, num_food=2, num_forests=2) -> Layout:
    agents = []
    for i in range(num_adversaries + num_good):
        adversary = i < num_adversaries
        name = "leadadversary_0" if i == 0 else f"adversary_{i - 1}" if adversary else f"agent_{i - num_adversaries}"
        agents.append(
            Body(
                name,
                size=0.075 if adversary else 0.045,
                silent=i > 0,
                accel=3.0 if adversary else 4.0,
                max_speed=1.0 if adversary else 1.3,
            )
        )
    landmarks = [Body(f"landmark {i}", size=0.2, movable=False) for i in range(num_obstacles)]
    landmarks += [Body(f"food {i}", size=0.03, movable=False, collide=False) for i in range(num_food)]
    landmarks += [Body(f"forest {i}", size=0.3, movable=False, collide=False) for i in range(num_forests)]
    n_ent = 4 + 2 * len(landmarks) + 2 * (len(agents) - 1) + num_forests
    obs_dims = [
        n_ent + 2 * num_good + 4 if i < num_adversaries else n_ent + 2 * (num_good - 1) for i in range(len(agents))
    ]
    return Layout(
        agents=agents,
        landmarks=landmarks,
        dim_c=4,
        obs_dims=obs_dims,
        n_adversaries=num_adversaries,
        n_obstacles=num_obstacles,
        n_food=num_food,
        n_forests=num_forests,
        landmark_range=0.9,
    )


@njit(cache=True)
def reward_world_comm(spec, world, rew):
    n, n_adv, size = spec.n_agents, spec.n_adversaries, spec.size
    food0 = n + spec.n_obstacles
    for e in range(rew.shape[0]):
        pos = world.pos[e]
        catches = adversary_contacts(size, pos, n_adv, n)
        for i in range(n):
            if i < n_adv:
                # adversary: -0.1 * distance to the closest good agent, +5 per (good, adversary) contact
                closest = np.inf
                for g in range(n_adv, n):
                    closest = min(closest, dist(pos, g, i))
                rew[e, i] = -0.1 * closest + 5.0 * catches
            else:
                # good: -5 per adversary touching it, -2 * bound, +2 per food touched,
                # -0.05 * distance to the closest food
                r = -5.0 * touched_by_adversaries(size, pos, n_adv, i)
                for p in range(2):
                    r -= 2 * bound_penalty(abs(pos[i, p]))
                closest = np.inf
                for f in range(food0, food0 + spec.n_food):
                    if touching(size, pos, i, f):
                        r += 2
                    closest = min(closest, dist(pos, f, i))
                rew[e, i] = r - 0.05 * closest


@njit(cache=True)
def observe_world_comm(spec, world, envs, out, scratch):
    # adversaries (leader included): [self_vel, self_pos, landmark_rel_positions,
    #     other_agent_rel_positions, good_agent_velocities, in_forest, leader_comm]
    # good agents: [self_vel, self_pos, landmark_rel_positions, other_agent_rel_positions,
    #     in_forest, good_agent_velocities]
    # Another agent is seen (else zeros) when both share a forest, or when neither is in any
    # forest, or always by the leader. in_forest[f] = +1 inside forest f, else -1.
    n, n_adv, n_f, size = spec.n_agents, spec.n_adversaries, spec.n_forests, spec.size
    forest0 = n + spec.n_landmarks - n_f
    inside = scratch.flags  # (A, n_forests) who is in which forest
    for e in envs:
        pos, vel, comm, row = world.pos[e], world.vel[e], world.comm[e], out[e]
        for a in range(n):
            for f in range(n_f):
                inside[a, f] = touching(size, pos, a, forest0 + f)
        for i in range(n):
            k = put2(row, spec.obs_offset[i], vel[i, 0], vel[i, 1])
            k = put2(row, k, pos[i, 0], pos[i, 1])
            for j in range(spec.n_landmarks):
                k = put_rel(row, k, pos, n + j, i)
            i_hidden = False
            for f in range(n_f):
                i_hidden = i_hidden or inside[i, f]
            # velocities of good agents go after the positions (adversaries) or after in_forest
            n_vel = n - n_adv - (0 if i < n_adv else 1)
            if i < n_adv:
                k_vel = k + 2 * (n - 1)
                k_forest = k_vel + 2 * n_vel
            else:
                k_forest = k + 2 * (n - 1)
                k_vel = k_forest + n_f
            for o in range(n):
                if o == i:
                    continue
                together = False
                o_hidden = False
                for f in range(n_f):
                    together = together or (inside[i, f] and inside[o, f])
                    o_hidden = o_hidden or inside[o, f]
                seen = together or (not i_hidden and not o_hidden) or i == 0
                if seen:
                    k = put_rel(row, k, pos, o, i)
                else:
                    k = put2(row, k, 0.0, 0.0)
                if o >= n_adv:
                    k_vel = put2(row, k_vel, vel[o, 0] if seen else 0.0, vel[o, 1] if seen else 0.0)
            for f in range(n_f):
                row[k_forest + f] = 1.0 if inside[i, f] else -1.0
            if i < n_adv:
                k = k_forest + n_f
                for c in range(spec.dim_c):
                    row[k + c] = comm[0, c]


# --- dispatch on spec.scenario, once per batch ------------------------------------------------------


@njit(cache=True)
def rewards(spec, world, rew):
    """Every agent's reward in every env after a step, into rew (E, A) float64."""
    s = spec.scenario
    if s == SIMPLE:
        reward_simple(spec, world, rew)
    elif s == SPREAD:
        reward_spread(spec, world, rew)
    elif s == REFERENCE:
        reward_reference(spec, world, rew)
    elif s == SPEAKER_LISTENER:
        reward_speaker_listener(spec, world, rew)
    elif s == ADVERSARY:
        reward_adversary(spec, world, rew)
    elif s == TAG:
        reward_tag(spec, world, rew)
    elif s == PUSH:
        reward_push(spec, world, rew)
    elif s == CRYPTO:
        reward_crypto(spec, world, rew)
    else:
        reward_world_comm(spec, world, rew)


@njit(cache=True)
def observe(spec, world, envs, out, scratch):
    """All agents' observations of the envs listed in `envs`, concatenated in agent order, into
    their rows of out (E, S) float32."""
    s = spec.scenario
    if s == SIMPLE:
        observe_simple(spec, world, envs, out, scratch)
    elif s == SPREAD:
        observe_spread(spec, world, envs, out, scratch)
    elif s == REFERENCE:
        observe_reference(spec, world, envs, out, scratch)
    elif s == SPEAKER_LISTENER:
        observe_speaker_listener(spec, world, envs, out, scratch)
    elif s == ADVERSARY:
        observe_adversary(spec, world, envs, out, scratch)
    elif s == TAG:
        observe_tag(spec, world, envs, out, scratch)
    elif s == PUSH:
        observe_push(spec, world, envs, out, scratch)
    elif s == CRYPTO:
        observe_crypto(spec, world, envs, out, scratch)
    else:
        observe_world_comm(spec, world, envs, out, scratch)


@njit(cache=True)
def terminals(spec, world, flags):
    """Scenario.is_terminal of every env into flags (E,): only spread and tag with
    terminate_on_success=True ever end early."""
    flags[:] = False
    if not spec.terminate_on_success:
        return
    if spec.scenario == SPREAD:
        terminal_spread(spec, world, flags)
    elif spec.scenario == TAG:
        terminal_tag(spec, world, flags)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("simple_v3", SIMPLE, {}, build_simple),
        Scenario(
            "simple_spread_v3",
            SPREAD,
            {
                "N": 3,
                "local_ratio": 0.5,
                "curriculum": False,
                "terminate_on_success": False,
                "num_agent_neighbors": None,
                "num_landmark_neighbors": None,
            },
            build_spread,
        ),
        Scenario("simple_reference_v3", REFERENCE, {"local_ratio": 0.5}, build_reference),
        Scenario("simple_speaker_listener_v4", SPEAKER_LISTENER, {}, build_speaker_listener),
        Scenario(
            "simple_adversary_v3",
            ADVERSARY,
            {"N": 2, "num_agent_neighbors": None, "num_landmark_neighbors": None},
            build_adversary,
        ),
        Scenario(
            "simple_tag_v3",
            TAG,
            {
                "num_good": 1,
                "num_adversaries": 3,
                "num_obstacles": 2,
                "curriculum": False,
                "terminate_on_success": False,
                "num_agent_neighbors": None,
                "num_landmark_neighbors": None,
            },
            build_tag,
        ),
        Scenario("simple_push_v3", PUSH, {}, build_push),
        Scenario("simple_crypto_v3", CRYPTO, {}, build_crypto),
        Scenario(
            "simple_world_comm_v3",
            WORLD_COMM,
            {"num_good": 2, "num_adversaries": 4, "num_obstacles": 1, "num_food": 2, "num_forests": 2},
            build_world_comm,
        ),
    ]
}
"""The nine mpe2 environments by module name, in mpe2's documentation order."""
