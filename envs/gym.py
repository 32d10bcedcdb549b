"""Single-agent Gymnasium envs for the single-agent scripts (DQN, DRQN, PPO), through Gymnasium's
own vector API: `make_gym` returns a `gymnasium.vector.SyncVectorEnv` wrapped in Gymnasium's
vector `RecordEpisodeStatistics`, and nothing else.

Autoreset mode: `AutoresetMode.SAME_STEP`, the same rule as the multi-agent envs. When env i
terminates or truncates, `step` resets it at once, so the returned `obs[i]` is already the first
observation of its next episode, and

    infos["final_obs"][i]       the last observation of the finished episode (object array, valid
                                where infos["_final_obs"][i]); bootstrap from it on truncation
    infos["episode"]["r"][i]    its return, ["l"][i] its length (valid where infos["_episode"][i])

Seeding: env i is seeded with `seed + i` at its first reset even when the script calls
`envs.reset()` without a seed (a `reset(seed=s)` still reseeds the usual Gymnasium way), and its
action space with `seed + i`. Later autoresets continue each env's own generator.

Partially observable CartPole, `CartPole-PO-v1` (`PO_CARTPOLE_ID`): CartPole-v1 with the two
velocities removed, so the observation is `[cart position, pole angle]` and a policy must infer the
velocities from history (the DRQN benchmark). Registered with Gymnasium when `envs` is imported;
otherwise identical to CartPole-v1 (500-step limit, same rewards).
"""

import os

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

PO_CARTPOLE_ID = "CartPole-PO-v1"
_VISIBLE = [0, 2]  # CartPole-v1 observation: [x, x_dot, theta, theta_dot]; keep x and theta


class HideVelocity(gym.ObservationWrapper):
    """Keep only cart position and pole angle of a CartPole observation."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(space.low[_VISIBLE], space.high[_VISIBLE], dtype=space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[_VISIBLE]


def make_po_cartpole(**kwargs) -> gym.Env:
    """The `CartPole-PO-v1` entry point: CartPole-v1 (with its time limit) minus the velocities."""
    return HideVelocity(gym.make("CartPole-v1", **kwargs))


if PO_CARTPOLE_ID not in gym.registry:
    gym.register(PO_CARTPOLE_ID, entry_point="envs.gym:make_po_cartpole")


class SeedFirstReset(gym.Wrapper):
    """Seed the env with `seed` at its first reset unless the caller passes a seed itself."""

    def __init__(self, env: gym.Env, seed: int):
        super().__init__(env)
        self._first_seed: int | None = seed

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is None:
            seed = self._first_seed
        self._first_seed = None
        return self.env.reset(seed=seed, options=options)


def make_gym(
    env_id: str,
    num_envs: int = 1,
    seed: int = 0,
    capture_video: bool = False,
    run_dir: str | os.PathLike | None = None,
    **env_kwargs,
) -> gym.vector.VectorEnv:
    """`num_envs` copies of a Gymnasium env in a `SyncVectorEnv` (SAME_STEP autoreset) with episode stats.

    Args:
        env_id: any Gymnasium id, e.g. "CartPole-v1", or `PO_CARTPOLE_ID` ("CartPole-PO-v1").
        num_envs: number of copies, stepped in this process.
        seed: env i is seeded with `seed + i` at its first reset, its action space too; the vector
            action space with `seed`.
        capture_video: film some episodes of env 0 (episodes 0, 1, 8, 27, ..., then every 1000th)
            into `<run_dir>/videos/`.
        run_dir: the run's folder (needed with `capture_video`).
        **env_kwargs: passed to `gymnasium.make`.

    Returns:
        The vector env; see the module docstring for where final observations and episode stats are.
    """
    if capture_video and run_dir is None:
        raise ValueError("capture_video=True needs run_dir (videos go to <run_dir>/videos)")
    from envs.video import VideoRecorder

    def thunk(i: int):
        def make_one() -> gym.Env:
            film = capture_video and i == 0
            env = gym.make(env_id, render_mode="rgb_array" if film else None, **env_kwargs)
            if film:
                env = VideoRecorder(env, os.path.join(os.fspath(run_dir), "videos"), name_prefix=env_id)
            env = SeedFirstReset(env, seed + i)
            env.action_space.seed(seed + i)
            return env

        return make_one

    vec = gym.vector.SyncVectorEnv([thunk(i) for i in range(num_envs)], autoreset_mode=AutoresetMode.SAME_STEP)
    vec = gym.wrappers.vector.RecordEpisodeStatistics(vec)
    vec.action_space.seed(seed)
    return vec
