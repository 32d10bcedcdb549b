"""Batched kernels: reset, observe and step all E worlds in one compiled call.

Each kernel loops over envs inside Numba and writes into arrays the caller preallocated, so a
step of E envs costs one Python -> Numba call. Single-threaded on purpose: vectorised envs are
benchmarked per core, and callers that want more cores run more processes.

`step_envs` does, for every env, what mpe2's parallel wrapper does after the last agent's action
(SimpleEnv._execute_world_step and step): decode actions, World.step, rewards, step count,
truncation at max_cycles (else the scenario's optional success termination), observations;
then, for finished envs with `autoreset`, it saves the pre-reset observations (`final_out`)
and the episodes' returns, redraws those worlds and observes them again. Each phase is one
call that loops over the envs (see `envs.mpe.physics`).
"""

from typing import NamedTuple

import numpy as np
from numba import njit

from envs.mpe.physics import reset_worlds, set_actions, world_step
from envs.mpe.scenarios import observe, rewards, terminals


class Scratch(NamedTuple):
    """Work arrays of one kernel call."""

    u: np.ndarray  # (E, A, 2) controls
    c: np.ndarray  # (E, A, dim_c) utterances
    force: np.ndarray  # (N, 2)
    has_force: np.ndarray  # (N,) bool
    rew: np.ndarray  # (E, A) float64 rewards
    ended: np.ndarray  # (E,) bool scenario success
    sel: np.ndarray  # (N,) int64 entities an agent observes
    dist: np.ndarray  # (N,) float64 their distances
    flags: np.ndarray  # (A, n_forests) bool who is in which forest


@njit(cache=True)
def new_scratch(spec, num_envs):
    n_ent = spec.n_agents + spec.n_landmarks
    return Scratch(
        np.zeros((num_envs, spec.n_agents, 2)),
        np.zeros((num_envs, spec.n_agents, spec.dim_c)),
        np.zeros((n_ent, 2)),
        np.zeros(n_ent, np.bool_),
        np.zeros((num_envs, spec.n_agents)),
        np.zeros(num_envs, np.bool_),
        np.zeros(n_ent, np.int64),
        np.zeros(n_ent),
        np.zeros((spec.n_agents, spec.n_forests), np.bool_),
    )


@njit(cache=True)
def reset_envs(spec, world, envs, state_out):
    """Redraw the worlds listed in `envs`, then write every env's observations into state_out (E, S)."""
    num_envs = world.pos.shape[0]
    reset_worlds(spec, world, envs)
    observe(spec, world, np.arange(num_envs), state_out, new_scratch(spec, 0))


@njit(cache=True)
def observe_envs(spec, world, state_out):
    """Every env's current observations into state_out (E, S), without changing the worlds."""
    observe(spec, world, np.arange(world.pos.shape[0]), state_out, new_scratch(spec, 0))


@njit(cache=True)
def first_bad_action(spec, act_i):
    """Index of the first env with an out-of-range discrete action, or -1 (checked before stepping)."""
    if spec.continuous:
        return -1
    for e in range(act_i.shape[0]):
        for i in range(spec.n_agents):
            if act_i[e, i] < 0 or act_i[e, i] >= spec.n_actions[i]:
                return e
    return -1


@njit(cache=True)
def step_envs(
    spec,
    world,
    act_i,
    act_f,
    max_cycles,
    autoreset,
    state_out,
    final_out,
    rew_out,
    term_out,
    trunc_out,
    done_out,
    ep_return_out,
    ep_length_out,
):
    """Step all envs once.

    act_i (E, A) int64 discrete actions, or act_f (E, A, D) float32 continuous ones (the other is
    ignored). Writes state_out (E, S) float32 next observations (after auto-reset), rew_out (E, A)
    float32, term_out (E, A) bool, trunc_out (E,) bool, done_out (E,) bool; and for envs with
    done_out[e] and autoreset: final_out[e] (pre-reset observations), ep_return_out[e] (A,) summed
    rewards and ep_length_out[e]. Returns the first env with an invalid action (nothing stepped), or -1.
    """
    bad = first_bad_action(spec, act_i)
    if bad >= 0:
        return bad
    num_envs = world.pos.shape[0]
    s = new_scratch(spec, num_envs)
    set_actions(spec, act_i, act_f, s.u, s.c)
    world_step(spec, world, s.u, s.c, s.force, s.has_force)
    rewards(spec, world, s.rew)
    terminals(spec, world, s.ended)
    n_done = 0
    for e in range(num_envs):
        world.steps[e] += 1
        truncated = world.steps[e] >= max_cycles  # mpe2 checks truncation before success
        terminated = (not truncated) and s.ended[e]
        for i in range(spec.n_agents):
            rew_out[e, i] = s.rew[e, i]
            world.ep_return[e, i] += s.rew[e, i]
            term_out[e, i] = terminated
        trunc_out[e] = truncated
        done_out[e] = truncated or terminated
        n_done += done_out[e]
    observe(spec, world, np.arange(num_envs), state_out, s)
    if autoreset and n_done > 0:
        finished = np.flatnonzero(done_out)
        for e in finished:
            final_out[e, :] = state_out[e, :]
            ep_return_out[e, :] = world.ep_return[e, :]
            ep_length_out[e] = world.steps[e]
        reset_worlds(spec, world, finished)
        observe(spec, world, finished, state_out, s)
    return -1
