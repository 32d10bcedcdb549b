"""The MPE world: its arrays, random numbers, actions to forces, one physics step, resets.

Everything compiled here is an `njit(cache=True)` function that loops over the envs of a batch
itself; `envs.mpe.kernels` calls each once per step. The worlds live in a `WorldState` (arrays
batched over envs), their static description in a `WorldSpec` (`envs.mpe.scenarios` builds one
per scenario). Entities are numbered agents first, then landmarks, like mpe2's `World.entities`.

The physics mirrors `mpe2._mpe_utils.core.World.step` (and `SimpleEnv._set_action`) operation by
operation, in float64, so that trajectories agree with mpe2 to rounding:

    force_i  = u_i + sum_j f_ij                   (u: agent control, f: soft contact force)
    f_ij     = F * (p_i - p_j) / d * k * log(1 + exp(-(d - (r_i + r_j)) / k))
    p_i     <- p_i + v_i dt
    v_i     <- v_i (1 - damping) + force_i / m_i dt,   then |v_i| is clipped to max_speed
    c_i     <- the agent's communication action (zeros for silent agents)

with F = contact_force = 100, k = contact_margin = 1e-3, dt = 0.1, damping = 0.25, m = 1.
mpe2 scenarios never set motor or communication noise, so there is none here. One liberty: pairs
more than FAR_GAP apart skip the force (below 1e-18, see FAR_GAP).
"""

import math
from typing import NamedTuple

import numpy as np
from numba import njit

# mpe2 World defaults (no scenario overrides them)
DT = 0.1
DAMPING = 0.25
CONTACT_FORCE = 100.0
CONTACT_MARGIN = 1e-3
MASS = 1.0
# mpe2 evaluates the contact force of every colliding pair; for a gap d - (r_i + r_j) above
# 40 k it is below F k e^-40 ~ 4e-19, which rounds away against any nonzero force (and moves an
# entity by ~1e-21 otherwise), so farther pairs are skipped: same results, 3-5x faster physics.
FAR_GAP = 40 * CONTACT_MARGIN
N_MOVES = 5  # discrete movement: no-op, -x, +x, -y, +y


class WorldSpec(NamedTuple):
    """What does not change during an episode (built by `envs.mpe.scenarios.build_spec`).

    Agents are entities 0..n_agents-1, landmarks the entities after them.
    """

    scenario: int  # scenario id, selects the reward and observation functions
    n_agents: int
    n_landmarks: int
    dim_c: int  # communication channel size
    continuous: bool  # continuous (Box) or discrete actions
    n_adversaries: int  # agents 0..n_adversaries-1 are the adversaries (or eve, or the predators)
    n_obstacles: int  # tag / world_comm: landmarks 0..n_obstacles-1 collide; then food, then forests
    n_food: int
    n_forests: int
    local_ratio: float  # spread / reference: weight of the local reward (NaN: no global reward)
    agent_neighbors: int  # partial observability: observe the k nearest other agents (0 = all)
    landmark_neighbors: int  # ... and the k nearest landmarks (0 = all)
    terminate_on_success: bool
    agent_range: float  # reset: agents uniform in [-agent_range, agent_range]^2
    landmark_range: float  # reset: landmarks uniform in [-landmark_range, landmark_range]^2
    size: np.ndarray  # (N,) float64 entity radius
    movable: np.ndarray  # (N,) bool
    collide: np.ndarray  # (N,) bool
    max_speed: np.ndarray  # (N,) float64, inf where mpe2 has None
    sensitivity: np.ndarray  # (A,) float64 agent.accel, or 5.0 where mpe2 has None
    silent: np.ndarray  # (A,) bool
    n_actions: np.ndarray  # (A,) int64 discrete action count, or continuous action size
    obs_offset: np.ndarray  # (A+1,) int64 agent i's observation is state[obs_offset[i]:obs_offset[i+1]]
    goal_choices: np.ndarray  # (G,) int64 reset draws goal[k] uniformly from range(goal_choices[k])


class WorldState(NamedTuple):
    """The mutable state of E worlds. Never handed to callers: they get copies."""

    pos: np.ndarray  # (E, N, 2) float64 entity positions
    vel: np.ndarray  # (E, N, 2) float64 entity velocities
    comm: np.ndarray  # (E, A, dim_c) float64 agent utterances (agent.state.c)
    goal: np.ndarray  # (E, G) int64 scenario assignments (goal landmark, private key, ...)
    steps: np.ndarray  # (E,) int64 steps taken in the current episode
    ep_return: np.ndarray  # (E, A) float64 summed reward of the current episode
    rng: np.ndarray  # (E,) uint64 SplitMix64 state of each env
    cam_range: np.ndarray  # (E,) float64 max |coordinate| at reset (mpe2's original_cam_range)


def new_world_state(spec: WorldSpec, num_envs: int) -> WorldState:
    """Zeroed storage for `num_envs` worlds of `spec` (reset it before use)."""
    n_ent = spec.n_agents + spec.n_landmarks
    return WorldState(
        pos=np.zeros((num_envs, n_ent, 2)),
        vel=np.zeros((num_envs, n_ent, 2)),
        comm=np.zeros((num_envs, spec.n_agents, spec.dim_c)),
        goal=np.zeros((num_envs, len(spec.goal_choices)), np.int64),
        steps=np.zeros(num_envs, np.int64),
        ep_return=np.zeros((num_envs, spec.n_agents)),
        rng=np.zeros(num_envs, np.uint64),
        cam_range=np.ones(num_envs),
    )


# --- random numbers --------------------------------------------------------------------------------
# SplitMix64 (Steele, Lea & Flood 2014): one uint64 of state per env, so every env has its own
# stream, seeded from numpy's SeedSequence(seed + i) in Python. mpe2's RNG streams cannot be matched;
# only the distributions are (uniform positions, uniform goal choices).

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@njit(cache=True, inline="always")
def next_u64(rng, e):
    z = rng[e] + _GAMMA
    rng[e] = z
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@njit(cache=True, inline="always")
def uniform(rng, e, low, high):
    """U[low, high) from the top 53 bits, like numpy's Generator.uniform."""
    unit = np.float64(next_u64(rng, e) >> np.uint64(11)) * (1.0 / 9007199254740992.0)
    return low + (high - low) * unit


@njit(cache=True, inline="always")
def integer(rng, e, n):
    """Uniform in range(n) (like Generator.integers(n), bias below 2**-53 * n)."""
    return min(int(uniform(rng, e, 0.0, 1.0) * n), n - 1)


# --- actions ---------------------------------------------------------------------------------------
# Each function below handles all E envs in one call: a call that receives the WorldSpec and
# WorldState tuples costs a reference-count update per array they hold, too much to pay per env.


@njit(cache=True)
def set_actions(spec, act_i, act_f, u, c):
    """Decode every env's actions into controls u (E, A, 2) and utterances c (E, A, dim_c).

    Mirrors SimpleEnv._execute_world_step + _set_action. Discrete: a movable, speaking agent has
    5 * dim_c actions, move = a % 5 and word = a // 5 (one-hot utterance); move 1..4 sets
    u = -x, +x, -y, +y. Continuous: actions are clipped to [0, 1] (mpe2's ClipOutOfBoundsWrapper),
    u = (a[2] - a[1], a[4] - a[3]) (the difference taken in float32, like mpe2) and the utterance
    is the remaining components verbatim. u is then scaled by the agent's sensitivity (accel or 5).
    Discrete actions must be in range (`kernels.first_bad_action` checks them before).
    """
    zero, one = np.float32(0.0), np.float32(1.0)
    for e in range(u.shape[0]):
        for i in range(spec.n_agents):
            u[e, i, 0] = 0.0
            u[e, i, 1] = 0.0
            c[e, i, :] = 0.0
            movable = spec.movable[i]
            if spec.continuous:
                a = act_f[e, i]
                off = 0
                if movable:
                    a1, a2 = min(max(a[1], zero), one), min(max(a[2], zero), one)
                    a3, a4 = min(max(a[3], zero), one), min(max(a[4], zero), one)
                    u[e, i, 0] = np.float64(a2 - a1)
                    u[e, i, 1] = np.float64(a4 - a3)
                    off = N_MOVES
                if not spec.silent[i]:
                    for k in range(spec.dim_c):
                        c[e, i, k] = np.float64(min(max(a[off + k], zero), one))
            else:
                a = act_i[e, i]
                if movable:
                    move = a % N_MOVES
                    a = a // N_MOVES
                    if move == 1:
                        u[e, i, 0] = -1.0
                    elif move == 2:
                        u[e, i, 0] = 1.0
                    elif move == 3:
                        u[e, i, 1] = -1.0
                    elif move == 4:
                        u[e, i, 1] = 1.0
                if not spec.silent[i]:
                    c[e, i, a] = 1.0
            u[e, i, 0] *= spec.sensitivity[i]
            u[e, i, 1] *= spec.sensitivity[i]


# --- physics ---------------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def softplus_margin(x):
    """np.logaddexp(0, x), evaluated the way numpy does (npy_logaddexp)."""
    if x == 0.0:
        return math.log(2.0)
    if x < 0.0:
        return math.log1p(math.exp(x))
    return x + math.log1p(math.exp(-x))


@njit(cache=True, error_model="numpy")  # coincident entities give NaN forces, as in mpe2, not an error
def world_step(spec, world, u, c, force, has_force):
    """One World.step of every env given controls u and utterances c; force/has_force are scratch."""
    n_ent = spec.n_agents + spec.n_landmarks
    size, movable, collide, max_speed = spec.size, spec.movable, spec.collide, spec.max_speed
    for e in range(u.shape[0]):
        pos = world.pos[e]
        vel = world.vel[e]
        # apply_action_force: movable agents push with u
        for i in range(n_ent):
            has_force[i] = False
            force[i, 0] = 0.0
            force[i, 1] = 0.0
        for i in range(spec.n_agents):
            if movable[i]:
                force[i, 0] = u[e, i, 0]
                force[i, 1] = u[e, i, 1]
                has_force[i] = True
        # apply_environment_force: soft contact between every colliding pair a < b, in entity order
        for a in range(n_ent):
            if not collide[a]:
                continue
            for b in range(a + 1, n_ent):
                if not collide[b]:
                    continue
                dx = pos[a, 0] - pos[b, 0]
                dy = pos[a, 1] - pos[b, 1]
                dist_min = size[a] + size[b]
                if dx * dx + dy * dy > (dist_min + FAR_GAP) ** 2:
                    continue  # force below 1e-18: a no-op for any nonzero force (see FAR_GAP)
                dist = math.sqrt(dx * dx + dy * dy)
                penetration = softplus_margin(-(dist - dist_min) / CONTACT_MARGIN) * CONTACT_MARGIN
                fx = CONTACT_FORCE * dx / dist * penetration
                fy = CONTACT_FORCE * dy / dist * penetration
                if movable[a]:
                    force[a, 0] = fx + force[a, 0]
                    force[a, 1] = fy + force[a, 1]
                    has_force[a] = True
                if movable[b]:
                    force[b, 0] = -fx + force[b, 0]
                    force[b, 1] = -fy + force[b, 1]
                    has_force[b] = True
        # integrate_state: semi-implicit Euler with damping and a speed limit
        for i in range(n_ent):
            if not movable[i]:
                continue
            pos[i, 0] += vel[i, 0] * DT
            pos[i, 1] += vel[i, 1] * DT
            vel[i, 0] = vel[i, 0] * (1.0 - DAMPING)
            vel[i, 1] = vel[i, 1] * (1.0 - DAMPING)
            if has_force[i]:
                vel[i, 0] += (force[i, 0] / MASS) * DT
                vel[i, 1] += (force[i, 1] / MASS) * DT
            if max_speed[i] < np.inf:
                speed = math.sqrt(vel[i, 0] * vel[i, 0] + vel[i, 1] * vel[i, 1])
                if speed > max_speed[i]:
                    vel[i, 0] = vel[i, 0] / speed * max_speed[i]
                    vel[i, 1] = vel[i, 1] / speed * max_speed[i]
        # update_agent_state: the utterance is the communication action, silence is zeros
        for i in range(spec.n_agents):
            for k in range(spec.dim_c):
                world.comm[e, i, k] = 0.0 if spec.silent[i] else c[e, i, k]


@njit(cache=True)
def reset_worlds(spec, world, envs):
    """Draw the initial state of the envs listed in `envs`: goals, then uniform positions, zero
    velocities and utterances. Every mpe2 scenario's reset_world draws these same distributions
    (in another order); the ranges and goal choices come from the spec."""
    rng = world.rng
    for e in envs:
        for k in range(spec.goal_choices.shape[0]):
            world.goal[e, k] = integer(rng, e, spec.goal_choices[k])
        cam = 0.0
        for i in range(spec.n_agents + spec.n_landmarks):
            r = spec.agent_range if i < spec.n_agents else spec.landmark_range
            for d in range(2):
                x = uniform(rng, e, -r, r)
                world.pos[e, i, d] = x
                world.vel[e, i, d] = 0.0
                cam = max(cam, abs(x))
        world.comm[e] = 0.0
        world.cam_range[e] = cam
        world.steps[e] = 0
        world.ep_return[e] = 0.0


# --- small geometry helpers used by the scenarios ---------------------------------------------------


@njit(cache=True, inline="always")
def dist(pos, i, j):
    """Euclidean distance between entities i and j of one env's positions (N, 2)."""
    dx = pos[i, 0] - pos[j, 0]
    dy = pos[i, 1] - pos[j, 1]
    return math.sqrt(dx * dx + dy * dy)


@njit(cache=True, inline="always")
def dist2(pos, i, j):
    dx = pos[i, 0] - pos[j, 0]
    dy = pos[i, 1] - pos[j, 1]
    return dx * dx + dy * dy


@njit(cache=True, inline="always")
def touching(size, pos, i, j):
    """The scenarios' is_collision: closer than the sum of the radii `size`."""
    return dist(pos, i, j) < size[i] + size[j]
