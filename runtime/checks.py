"""Every flag checked at the start, before any work, in one place: one error line that names the flag."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os

import torch

from runtime.checkpoint import flag, not_a_checkpoint_file

# flags that exist in several scripts, by what they must be (a script checks the ones it has)
POSITIVE_INT = ("total_timesteps", "num_envs", "num_steps", "update_epochs", "num_minibatches", "eval_episodes",
                "batch_size", "buffer_size", "train_frequency", "gradient_steps", "hidden_size", "rnn_chunk",
                "log_interval", "target_network_frequency", "policy_frequency", "n_step", "mixing_embed_dim",
                "hypernet_embed", "critic_updates", "critic_hidden_size", "self_play_interval",
                "self_play_pool", "central_mixing_embed_dim", "max_cycles", "max_episode_len",
                "map_size")  # fmt: skip
NON_NEGATIVE_INT = (
    "seed",
    "eval_interval",
    "final_eval_episodes",
    "learning_starts",
    "torch_threads",
    "burn_in",
    "seq_len",
)
POSITIVE = ("learning_rate", "actor_lr", "critic_lr", "q_lr", "alpha_lr", "alpha", "max_grad_norm",
            "checkpoint_minutes", "clip_coef", "tau", "gumbel_temperature", "actor_adam_eps")  # fmt: skip
NON_NEGATIVE = ("ent_coef", "vf_coef", "huber_delta", "exploration_noise", "policy_noise", "noise_clip",
                "actor_reg", "target_policy_noise", "target_noise_clip")  # fmt: skip
UNIT = ("gamma", "gae_lambda", "tau", "prioritized_replay_alpha", "prioritized_replay_beta", "start_e", "end_e",
        "exploration_fraction", "td_lambda", "weighting_alpha")  # fmt: skip


class ArgumentError(ValueError):
    """A flag with a value the script cannot run with."""


class RunStopped(Exception):
    """A stop request (Ctrl-C, SIGTERM) was honoured after last.pt was written; the message says how to go on."""


class RunFinished(Exception):
    """--resume of a run that finished at or past --total-timesteps: nothing to train, nothing evaluated again (its
    final_eval.json stands); the script ends (exit code 0) with the exception's line."""


class CheckpointPlayed(Exception):
    """--eval-checkpoint: `Run` played the checkpoint instead of training, and the script ends (exit code 0)."""


def check_args(args, *rules) -> None:
    """Check the shared rules for every flag `args` has, then `rules`: (condition that must hold, message) pairs."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    for name, v in values.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise ArgumentError(f"{flag(name)} {v} is not a finite number")
    for names, ok, what in (
        (POSITIVE_INT, lambda v: v >= 1, "must be a positive integer"),
        (NON_NEGATIVE_INT, lambda v: v >= 0, "must be >= 0"),
        (POSITIVE, lambda v: v > 0, "must be > 0"),
        (NON_NEGATIVE, lambda v: v >= 0, "must be >= 0"),
        (UNIT, lambda v: 0 <= v <= 1, "must lie in [0, 1]"),
    ):
        for name in names:
            if values.get(name) is not None and not ok(values[name]):
                raise ArgumentError(f"{flag(name)} {values[name]} {what}")
    if "env_kwargs" in values:
        try:
            kwargs = json.loads(values["env_kwargs"])
        except json.JSONDecodeError as e:
            raise ArgumentError(f"--env-kwargs is not valid JSON ({e}); use e.g. '{{\"N\": 5}}'") from None
        if not isinstance(kwargs, dict):
            raise ArgumentError(
                f"--env-kwargs must be a JSON object such as '{{\"N\": 5}}', not {values['env_kwargs']}"
            )
    for name, choices in (("backend", ("auto", "numba", "native", "pettingzoo")), ("vector", ("sync", "subproc"))):
        if name in values and values[name] not in choices:
            raise ArgumentError(f"{flag(name)} {values[name]!r} is not one of {list(choices)}")
    if values.get("batch_size") and values.get("buffer_size") and values["batch_size"] > values["buffer_size"]:
        raise ArgumentError(f"--batch-size {values['batch_size']} exceeds --buffer-size {values['buffer_size']}: "
                            f"a batch is drawn from the buffer")  # fmt: skip
    if values.get("eval_checkpoint") and (problem := not_a_checkpoint_file(values["eval_checkpoint"])):
        raise ArgumentError(f"--eval-checkpoint {values['eval_checkpoint']}: {problem}")
    if values.get("eval_checkpoint") and values.get("resume"):
        raise ArgumentError("--eval-checkpoint and --resume exclude each other: evaluate, or continue training")
    if (
        values.get("resume")
        and values.get("run_dir")
        and os.path.abspath(values["run_dir"]) != os.path.abspath(values["resume"])
    ):
        raise ArgumentError("--resume continues in its own directory: drop --run-dir")
    if values.get("track") and importlib.util.find_spec("wandb") is None:
        raise ArgumentError(
            "--track logs to Weights & Biases, which is not installed: pip install wandb, or drop --track"
        )
    if values.get("cuda") and not torch.cuda.is_available():
        raise ArgumentError("--cuda was given but no CUDA device is available: drop --cuda to train on the CPU")
    for ok, message in rules:
        if not ok:
            raise ArgumentError(message)


def episode_length(args, limit: int | None) -> int:
    """The longest episode an episode replay stores: --max-episode-len, else the env's time limit `limit`. A
    --seq-len window must fit in it."""
    max_len = args.max_episode_len or limit
    if not max_len:
        raise ArgumentError(f"{args.env_id} has no time limit: give the longest episode to store with "
                            f"--max-episode-len")  # fmt: skip
    seq_len = getattr(args, "seq_len", 0)
    if seq_len > max_len:
        raise ArgumentError(
            f"--seq-len {seq_len} is longer than {args.env_id}'s episodes (at most {max_len} steps): its windows "
            f"would be padding; give at most {max_len}, or 0 for whole episodes"
        )
    return max_len


def check_action_flags(args, env, continuous_only=(), discrete_only=()) -> None:
    """A flag changed from its default that only means something for the other kind of actions is refused."""
    defaults = {f.name: f.default for f in dataclasses.fields(args)}
    kinds = {s.discrete for s in env.groups.values()}
    for names, needs, have in ((continuous_only, False, "discrete"), (discrete_only, True, "continuous")):
        for name in names:
            if needs not in kinds and getattr(args, name) != defaults[name]:
                hint = "add --continuous-actions" if not needs else "add --no-continuous-actions"
                raise ArgumentError(f"{flag(name)} applies to {'discrete' if needs else 'continuous'} actions only, "
                                    f"and {args.env_id} has {have} actions here: drop it, or {hint}")  # fmt: skip


def check_discrete(args, env, algo: str, alternatives: str = "ppo.py") -> None:
    """A script for discrete actions refuses any other: a Gymnasium env's single action space, or every group of
    one of our multi-agent envs. `alternatives` names the scripts that handle continuous actions."""
    if hasattr(env, "groups"):
        if continuous := [g for g, spec in env.groups.items() if not spec.discrete]:
            hint = "drop --continuous-actions, or " if getattr(args, "continuous_actions", False) else ""
            raise ArgumentError(f"{algo} needs discrete actions, but {args.env_id} has continuous actions for "
                                f"{continuous} here: {hint}use {alternatives} for continuous actions")  # fmt: skip
        return
    import gymnasium as gym

    if not isinstance(env.single_action_space, gym.spaces.Discrete):
        raise ArgumentError(f"{algo} needs a discrete action space, but {args.env_id} has {env.single_action_space}: "
                            f"use {alternatives} for continuous actions")  # fmt: skip
