"""Episode videos as mp4 files, written with imageio's ffmpeg plugin.

* `record_episode(env_id, act_fn, path, ...)` plays one episode of a multi-agent env with a policy
  and writes it; every script's `--capture-video` and `--eval-checkpoint` use it.
* `VideoRecorder` is a Gymnasium wrapper that films some episodes of a single-agent env (what
  `envs.make_gym(capture_video=True)` puts around env 0). It replaces Gymnasium's `RecordVideo`,
  which needs moviepy.
* `write_video(frames, path, fps)` is the shared writer.
"""

import os
from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np

from envs.api import EpisodeStats, Observation


def write_video(frames: Sequence[np.ndarray], path: str | os.PathLike, fps: int = 30) -> str:
    """Write `(H, W, 3)` uint8 frames to an H.264 mp4 at `path` (parent folders are created).

    Odd frame sizes are padded by one black row/column: H.264 with yuv420p needs even sizes.
    """
    import imageio.v2 as imageio  # imported on use: ffmpeg is only needed when filming

    if len(frames) == 0:
        raise ValueError("no frames to write")
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with imageio.get_writer(path, fps=fps, codec="libx264", macro_block_size=1, format="FFMPEG") as writer:
        for frame in frames:
            frame = np.asarray(frame, dtype=np.uint8)
            h, w = frame.shape[:2]
            if h % 2 or w % 2:
                frame = np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)))
            writer.append_data(frame)
    return path


def record_episode(
    env_id: str,
    act_fn: Callable[[Observation], dict[str, np.ndarray]],
    path: str | os.PathLike,
    seed: int = 0,
    backend: str = "pettingzoo",
    fps: int | None = None,
    max_steps: int = 100_000,
    wrap: Callable | None = None,
    **env_kwargs,
) -> tuple[str, EpisodeStats | None]:
    """Play one episode of `env_id` with `act_fn` and write its `rgb_array` frames to an mp4.

    Args:
        env_id: any id `envs.make` accepts.
        act_fn: maps the `Observation` of the single env (E=1) to the actions dict `step` takes,
            e.g. `lambda o: {g: policy(o.obs[g]) for g in o.obs}`.
        path: where the mp4 goes.
        seed: the episode's seed (env reset with `seed`).
        backend: "pettingzoo" or "numba", as in `envs.make`.
        fps: frames per second; default the env's `render_fps` metadata, else 10.
        max_steps: stop after this many steps even if the episode has not finished.
        wrap: applied to the env before playing (e.g. a wrapper that acts for some groups).
        **env_kwargs: passed to the env, as in `envs.make` (`render_mode="rgb_array"` is added for
            PettingZoo envs).

    Returns:
        (path, stats): the file written and the episode's `EpisodeStats` (None if cut at max_steps).
    """
    from envs.registry import make

    if backend == "pettingzoo":
        env_kwargs.setdefault("render_mode", "rgb_array")
    env = make(env_id, num_envs=1, seed=seed, vector="sync", backend=backend, **env_kwargs)
    # The sync PettingZoo runner can render the last frame before its auto-reset wipes it.
    runners = getattr(env, "runners", None)
    if runners:
        runners[0].keep_final_frame = True
    fps = fps or getattr(env, "render_fps", None) or 10
    try:
        env = wrap(env) if wrap is not None else env
        obs = env.reset(seed=seed)
        frames = [env.render(0)]
        stats = None
        for _ in range(max_steps):
            result = env.step(act_fn(obs))
            if result.done[0]:
                stats = result.episodes[0]
                last = runners[0].final_frame if runners else None
                if last is not None:
                    frames.append(np.asarray(last))
                break
            frames.append(env.render(0))
            obs = result.next
    finally:
        env.close()
    return write_video(frames, path, fps=fps), stats


def capped_cubic_schedule(episode: int) -> bool:
    """Film episodes 0, 1, 8, 27, ..., 729, then every 1000th: often early, rarely later."""
    if episode < 1000:
        return round(episode ** (1 / 3)) ** 3 == episode
    return episode % 1000 == 0


class VideoRecorder(gym.Wrapper):
    """Film the episodes of a single-agent env chosen by `episode_trigger` into `folder`.

    The env must be made with `render_mode="rgb_array"`. Files are named
    `<name_prefix>-episode-<n>.mp4`; an episode is written when it terminates or is truncated.
    """

    def __init__(
        self,
        env: gym.Env,
        folder: str | os.PathLike,
        episode_trigger: Callable[[int], bool] = capped_cubic_schedule,
        name_prefix: str = "rl-video",
        fps: int | None = None,
    ):
        super().__init__(env)
        if env.render_mode != "rgb_array":
            raise ValueError(f"VideoRecorder needs render_mode='rgb_array', got {env.render_mode!r}")
        self.folder = os.fspath(folder)
        self.episode_trigger = episode_trigger
        self.name_prefix = name_prefix
        self.fps = fps or env.metadata.get("render_fps") or 30
        self.episode_id = -1
        self.frames: list[np.ndarray] = []
        self.recording = False

    def reset(self, **kwargs):
        obs, info = super().reset(**kwargs)
        self.episode_id += 1
        self.recording = self.episode_trigger(self.episode_id)
        self.frames = [self.env.render()] if self.recording else []
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.recording:
            self.frames.append(self.env.render())
            if terminated or truncated:
                path = os.path.join(self.folder, f"{self.name_prefix}-episode-{self.episode_id}.mp4")
                write_video(self.frames, path, fps=self.fps)
                self.frames, self.recording = [], False
        return obs, reward, terminated, truncated, info
