"""Evaluation protocol v2, in one place.

* Periodic evaluations play fresh episodes: evaluation k of seed s seeds env i with
  `periodic_seed(s, k, n) + i` = 10^7 + 10^6 s + k n + i, so no start state is played twice in a run (k counts the
  run's evaluations, also across --resume) and seeds do not share starts (for seeds 0-2000 and runs of fewer than
  10^6 evaluation episodes).
* The final policy plays a fixed set: env i seeded `FINAL_SEED + i`, i < `FINAL_EPISODES`, the same for every
  algorithm and seed, so rows of results/README.md compare pairwise. It is written to `final_eval.json`.
* Every episode is greedy and runs on the standard env (PettingZoo, or Gymnasium), one episode per env, so short
  episodes are not favoured. Torch and numpy draws of an evaluation (e.g. a group frozen to random) come from
  streams of their own, so evaluating never changes training.

A script hands over its greedy policy as `make_greedy = acting(...)`: `make(num_envs, rng) -> act_fn(obs, done) ->
actions` (runtime/opponents.py's MakePolicy and Act), where `done` is the previous step's (E,) done mask (None at the
first step), for policies with a hidden state to reset.
"""

from __future__ import annotations

import io
import os

import gymnasium as gym
import imageio
import numpy as np
import torch

import envs
from runtime.args import env_kwargs, env_signature, freeze
from runtime.checkpoint import load_checkpoint, restore

FINAL_SEED = 10_000
FINAL_EPISODES = 1000
BATCH = 100  # envs stepped side by side; the episodes do not depend on it


def periodic_seed(seed: int, k: int, episodes: int) -> int:
    """The seed of env 0 in the k-th periodic evaluation of a run with --seed `seed`."""
    return 10**7 + 10**6 * seed + k * episodes


def play(env, greedy, num_envs: int, stop=None):
    """One greedy episode per env of `env`: (returns (E,), per-group returns {g: (E,)} or {})."""
    returns, groups = np.full(num_envs, np.nan), {}
    gym_env = isinstance(env, gym.vector.VectorEnv)
    obs, done = (env.reset()[0] if gym_env else env.reset()), None
    with torch.no_grad():
        while np.isnan(returns).any():
            if stop is not None:
                stop()
            actions = greedy(obs, done)
            if gym_env:
                obs, _, terminated, truncated, infos = env.step(actions)
                done = terminated | truncated
                if "_episode" in infos:
                    first = infos["_episode"] & np.isnan(returns)
                    returns[first] = infos["episode"]["r"][first]
                continue
            step = env.step(actions)
            for ep in step.episodes:
                if np.isnan(returns[ep.env_index]):
                    returns[ep.env_index] = ep.episode_return
                    for g, r in ep.group_returns.items():
                        groups.setdefault(g, np.full(num_envs, np.nan))[ep.env_index] = r
            obs, done = step.next, step.done
    return returns, groups


def evaluate(make_env, make_greedy, episodes: int, seed: int, stop=None):
    """Greedy returns of `episodes` episodes, env i seeded `seed + i` (played `BATCH` at a time), and per group."""
    returns, groups = [], {}
    with torch.random.fork_rng(devices=[]):  # the draws of an evaluation never move the training streams
        torch.manual_seed(seed)
        rng = np.random.default_rng(seed)
        for lo in range(0, episodes, BATCH):
            n = min(BATCH, episodes - lo)
            env = make_env(n, seed + lo)
            try:
                r, g = play(env, make_greedy(n, rng), n, stop)
            finally:
                env.close()
            returns.append(r)
            for k, v in g.items():
                groups.setdefault(k, []).append(v)
    return np.concatenate(returns), {k: np.concatenate(v) for k, v in groups.items()}


def check_filmable(args) -> None:
    """--capture-video: a ValueError before any training where the env has no picture (a matrix game, an env of
    one's own whose render() returns nothing), not a crash at the first evaluation. Draws one frame of a multi-agent
    env's first episode."""
    if not args.capture_video or not hasattr(args, "env_kwargs"):  # Gymnasium's envs: gym.make says it
        return
    kwargs = {"render_mode": "rgb_array", **env_kwargs(args)}
    env = envs.make(args.env_id, 1, 0, vector="sync", backend="pettingzoo", **kwargs)
    try:
        env.reset()
        env.render(0)
    except NotImplementedError as e:
        raise ValueError(str(e)) from None
    finally:
        env.close()


def record(args, make_greedy, path: str, seed: int):
    """Film one greedy episode (env seeded `seed`) to the mp4 `path`; returns its frames (T, H, W, 3) or None."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        greedy = make_greedy(1, np.random.default_rng(seed))
        if hasattr(args, "env_kwargs"):  # a multi-agent env of envs.make
            wrap = lambda env: freeze(args, env, seed)  # noqa: E731  the frozen groups act in the video too
            envs.record_episode(args.env_id, lambda o: greedy(o, None), path, seed=seed, wrap=wrap, **env_kwargs(args))
        else:
            frames, env = [], gym.make(args.env_id, render_mode="rgb_array")
            obs, _ = env.reset(seed=seed)
            done = False
            while not done:
                frames.append(env.render())
                action = greedy(obs[None], None)[0]
                obs, _, terminated, truncated, _ = env.step(action)
                done = terminated or truncated
            env.close()
            envs.write_video(frames, path, fps=env.metadata.get("render_fps") or 30)
    try:
        return np.stack(imageio.mimread(path, memtest=False))
    except Exception:  # a codec this imageio cannot read back: the mp4 is still there
        return None


def add_video(writer, tag: str, frames: np.ndarray, step: int, fps: int = 10, width: int = 240) -> None:
    """An animated GIF of `frames` in TensorBoard's image tab (what SummaryWriter.add_video writes, without moviepy)."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    stride = max(1, frames.shape[2] // width)
    frames = frames[:, ::stride, ::stride, :3]
    buf = io.BytesIO()
    imageio.mimwrite(buf, list(frames), format="GIF", duration=1000 / fps, loop=0)
    image = Summary.Image(height=frames.shape[1], width=frames.shape[2], colorspace=3,
                          encoded_image_string=buf.getvalue())  # fmt: skip
    writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)


def evaluate_checkpoint(args, algo, env, nets, make_env, make_greedy, network_flags=()):
    """--eval-checkpoint: load the networks `nets` (name -> module), play --eval-episodes of the fixed episode set
    greedily, print one line (and film one episode with --capture-video)."""
    path = args.eval_checkpoint
    ckpt = load_checkpoint(path, algo, args, env_signature(env), network_flags)
    restore(ckpt, path, nets)
    returns, groups = evaluate(make_env, make_greedy, args.eval_episodes, FINAL_SEED)
    video = os.path.join(os.path.dirname(path), "eval.mp4") if args.capture_video else None
    if video:
        record(args, make_greedy, video, FINAL_SEED)
    per_group = {g: float(np.mean(r)) for g, r in groups.items()}
    print(f"{args.env_id} {algo} {path}: episodic return {returns.mean():.2f} ± {returns.std():.2f} over "
          f"{len(returns)} greedy episodes" + (f"; per group {per_group}" if per_group else "")
          + (f"; video {video}" if video else ""))  # fmt: skip
    return returns, per_group
