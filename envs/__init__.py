"""Environments for the scripts in `algos/`: multi-agent PettingZoo envs behind one vectorized
interface (`envs/api.py`), single-agent Gymnasium envs through Gymnasium's own vector API, and
episode videos.

    import envs
    vec = envs.make("simple_spread_v3", num_envs=8, seed=1, vector="subproc")
    obs = vec.reset()                      # Observation: obs[g] (E, A, ...), state (E, S), ...
    result = vec.step({"agent": actions})  # StepResult: next, rewards, terminated, truncated, final, ...

    gym_envs = envs.make_gym("CartPole-PO-v1", num_envs=4, seed=1)   # velocities hidden (for DRQN)
    envs.record_episode("simple_spread_v3", act_fn, "runs/x/videos/eval.mp4", seed=0)

Module map: `api` (the contract), `registry` (ids and `make`), `pettingzoo_env` (groups, dead
agents, auto-reset, sync vectorization), `subproc` (worker processes over shared memory), `gym`
(single-agent), `video` (mp4 recording). `envs.mpe` is the Numba MPE backend (`backend="numba"`);
`foraging`/`foraging_numba` and `warehouse`/`warehouse_numba` are LBF and RWARE and their Numba ports,
`grid_render` their video frames.
"""

from envs.api import EpisodeStats, GroupSpec, Observation, StepResult, VecEnv
from envs.gym import PO_CARTPOLE_ID, make_gym
from envs.pettingzoo_env import SyncVecEnv
from envs.registry import (
    EnvArgumentError,
    EnvNotAvailableError,
    UnknownEnvError,
    env_factory,
    known_ids,
    lookup,
    make,
    unknown_id,
)
from envs.subproc import EnvWorkerError, SubprocVecEnv
from envs.video import record_episode, write_video

__all__ = [
    "PO_CARTPOLE_ID",
    "EnvArgumentError",
    "EnvNotAvailableError",
    "EnvWorkerError",
    "EpisodeStats",
    "GroupSpec",
    "Observation",
    "StepResult",
    "SubprocVecEnv",
    "SyncVecEnv",
    "UnknownEnvError",
    "VecEnv",
    "env_factory",
    "known_ids",
    "lookup",
    "make",
    "make_gym",
    "record_episode",
    "unknown_id",
    "write_video",
]
