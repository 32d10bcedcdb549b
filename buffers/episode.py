"""Whole-episode replay for recurrent learners (QMIX, VDN, DRQN, recurrent MAPPO).

Each env writes its running episode into its own staging row; `finish(env_ids, **final)` closes the
episodes of the given envs (which may end at different steps) and moves them into the ring of stored
episodes, padded with zeros to `max_len`. Row `len` of an episode holds the final observation (what
comes after the last step), so a stored episode has ``max_len + 1`` rows and ``filled`` marks the
``len`` real steps.
"""

import numpy as np

from buffers.replay import Priorities
from buffers.schema import BufferInputError, Schema
from buffers.snapshot import Snapshot

__all__ = ["EpisodeReplayBuffer", "team_fields", "team_step", "agent_views"]


def team_fields(groups, state_shape=None, team_reward=True):
    """The schema of one step of a multi-agent team, as the value-decomposition scripts store it (and HAPPO's rollout).

    For every group ``g`` of ``groups`` (name -> ``envs.api.GroupSpec``), with ``A`` its agents: ``obs_g``
    ``(A, *obs_shape)``, ``actions_g`` ``(A,)`` indices or ``(A, action_dim)`` vectors for continuous actions,
    ``agent_mask_g`` ``(A,)`` and, with action masks, ``avail_g`` ``(A, action_dim)``. ``team_reward``: one
    ``reward`` and ``terminated`` per step for the team (VDN, QMIX); else ``rewards_g`` and ``terminated_g`` ``(A,)``
    per agent (IQL). With ``state_shape``, ``state``. The names are :func:`buffers.joint_fields`'s.
    """
    fields = {"reward": ((), np.float32), "terminated": ((), np.bool_)} if team_reward else {}
    for g, s in groups.items():
        A = s.n_agents
        fields |= {
            f"obs_{g}": ((A, *s.obs_shape), np.float32),
            f"actions_{g}": ((A,), np.int64) if s.discrete else ((A, s.action_dim), np.float32),
            f"agent_mask_{g}": ((A,), np.bool_),
        }
        if s.has_action_mask:
            fields[f"avail_{g}"] = ((A, s.action_dim), np.bool_)
        if not team_reward:
            fields |= {f"rewards_{g}": ((A,), np.float32), f"terminated_{g}": ((A,), np.bool_)}
    if state_shape is not None:
        fields["state"] = (state_shape, np.float32)
    return fields


def agent_views(obs, groups, state=False, envs=slice(None)):
    """What the agents of ``groups`` see in the ``envs`` of an ``Observation``, as :func:`team_fields` names it:
    ``obs_g``, ``agent_mask_g``, ``avail_g`` where the group has action masks, and ``state`` if asked. Passed to
    ``EpisodeReplayBuffer.finish`` with ``step.final`` and the finished envs, it stores the final observation."""
    sources = dict(obs=obs.obs, agent_mask=obs.agent_mask, avail=obs.avail_actions)
    out = {f"{k}_{g}": v[g][envs] for k, v in sources.items() for g in groups if g in v}
    return out | ({"state": obs.state[envs]} if state else {})


def team_step(obs, actions, step, groups, state=False, team_reward=True):
    """One step of every env as :func:`team_fields` declares it, for ``EpisodeReplayBuffer.add(**...)``.

    ``obs`` is the ``Observation`` acted on, ``actions`` the actions sent (group -> array), ``step`` the
    ``StepResult``. With ``team_reward``, the team's reward is the mean over all its agents and it terminates when
    all of them have; groups rewarded differently compete, which one team reward cannot express (an error).
    """
    out = agent_views(obs, groups, state) | {f"actions_{g}": actions[g] for g in groups}
    if not team_reward:
        return out | {f"{k}_{g}": getattr(step, k)[g] for k in ("rewards", "terminated") for g in groups}
    if len(groups) > 1 and np.ptp([step.rewards[g].mean(1) for g in groups], 0).max() > 1e-6:
        raise BufferInputError(
            f"the learning groups {list(groups)} are rewarded differently, so they compete, and a team is "
            "trained on one reward: freeze the opponents (--random-groups or --opponent), or use iql.py, "
            "mappo.py or maddpg.py, which train groups apart"
        )
    rewards = np.concatenate([step.rewards[g] for g in groups], 1)  # (E, N)
    terminated = np.concatenate([step.terminated[g] for g in groups], 1)
    return out | {"reward": rewards.mean(1), "terminated": terminated.all(1)}


class EpisodeReplayBuffer(Snapshot):
    """A ring of `capacity` episodes of at most `max_len` steps each, from `num_envs` envs.

    Uniform sampling by default; ``alpha`` switches to proportional prioritized sampling of episodes
    (then ``sample(..., beta=)`` returns ``weights`` and ``update_priorities`` takes per-episode errors).
    """

    def __init__(self, capacity, max_len, num_envs, fields, alpha=None):
        if capacity < 1 or max_len < 1 or num_envs < 1:
            raise BufferInputError(f"capacity={capacity}, max_len={max_len}, num_envs={num_envs} must be >= 1")
        self.capacity, self.max_len, self.num_envs = int(capacity), int(max_len), int(num_envs)
        self.schema = Schema(fields)
        rows = self.max_len + 1  # the steps, then the final observation
        self.staging = self.schema.allocate((self.num_envs, rows))
        self.data = self.schema.allocate((self.capacity, rows))
        self.lengths = np.zeros(self.capacity, dtype=np.int64)
        self.t = np.zeros(self.num_envs, dtype=np.int64)  # steps written so far, per env
        self.pos, self.size = 0, 0
        self.priorities = None if alpha is None else Priorities(self.capacity, alpha)

    def __len__(self):
        """Number of stored (finished) episodes."""
        return self.size

    def add(self, **step):
        """Append one step to every env's running episode (each declared field, shape (num_envs, *shape))."""
        over = np.flatnonzero(self.t >= self.max_len)
        if over.size:
            raise BufferInputError(
                f"env {over[0]}'s episode is longer than max_len={self.max_len}: raise max_len to the "
                "env's episode limit, or call finish() for envs whose episode ended"
            )
        envs = np.arange(self.num_envs)
        for name, arr in self.schema.check(step, (self.num_envs,)).items():
            self.staging[name][envs, self.t] = arr
        self.t += 1

    def finish(self, env_ids, **final):
        """Close the running episodes of `env_ids` and store them.

        `final` holds any declared fields of the observation after the last step (e.g. ``obs``,
        ``state``, ``avail_actions``), each shaped (len(env_ids), *shape); they go to row ``len``.
        """
        env_ids = np.asarray(env_ids, dtype=np.int64).reshape(-1)
        if env_ids.size == 0:
            return np.empty(0, dtype=np.int64)
        if np.any((env_ids < 0) | (env_ids >= self.num_envs)):
            raise BufferInputError(f"env_ids {env_ids.tolist()} must lie in [0, {self.num_envs})")
        if env_ids.size > 1:
            ordered = np.sort(env_ids)
            twice = ordered[1:][ordered[1:] == ordered[:-1]]
            if twice.size:
                raise BufferInputError(
                    f"env_ids {env_ids.tolist()} name env {twice[0]} more than once, expected each env at most once: "
                    "pass every env whose episode ended once (e.g. np.flatnonzero(done))"
                )
        empty = env_ids[self.t[env_ids] == 0]
        if empty.size:
            raise BufferInputError(f"env {empty[0]} has no steps to finish: add() at least one step first")
        steps = self.t[env_ids]
        for name, arr in self.schema.check(final, (len(env_ids),), partial=True).items():
            self.staging[name][env_ids, steps] = arr
        slots = (self.pos + np.arange(len(env_ids))) % self.capacity
        for name in self.schema:
            self.data[name][slots] = self.staging[name][env_ids]
            self.staging[name][env_ids] = 0  # padding of the next episode is zeros again
        self.lengths[slots] = steps
        self.t[env_ids] = 0
        self.pos = (self.pos + len(env_ids)) % self.capacity
        self.size = min(self.size + len(env_ids), self.capacity)
        if self.priorities is not None:
            self.priorities.add(slots)
        return slots

    def sample(self, batch_size, rng, beta=0.4, seq_len=0, burn_in=0):
        """A batch of episodes, time-major: dict name -> (L + 1, batch, *shape).

        ``seq_len=0``: whole episodes; L is the longest episode in the batch (padding beyond it is dropped).
        ``seq_len > 0``: per episode a random window of ``seq_len`` steps (R2D2-style), preceded by up to
        ``burn_in`` steps that only warm up a recurrent state, and followed by one row for the bootstrap;
        then L = burn_in + seq_len and rows past an episode's end are padding.

        Also returns ``filled`` (L + 1, batch) bool, True on real steps; ``loss_mask`` (L + 1, batch) bool,
        the steps a loss counts (filled, not burn-in, inside the window); ``indices``; ``weights`` when
        prioritized. One ``rng.random(batch)`` draw places the windows, after the episodes are drawn.
        """
        if self.size == 0:
            raise BufferInputError("cannot sample from an empty episode buffer: finish() an episode first")
        if not 1 <= batch_size <= self.size:
            raise BufferInputError(
                f"batch_size={batch_size} but the buffer holds {self.size} episodes: sample at most that many"
            )
        if seq_len < 0 or burn_in < 0:
            raise BufferInputError(f"seq_len={seq_len} and burn_in={burn_in} must be >= 0")
        batch = {}
        if self.priorities is None:
            indices = rng.choice(self.size, batch_size, replace=False)
        else:
            indices, batch["weights"] = self.priorities.sample(batch_size, beta, rng, self.size)
        lengths = self.lengths[indices]
        if seq_len == 0:
            rows = int(lengths.max()) + 1
            for name in self.schema:
                batch[name] = np.swapaxes(self.data[name][indices, :rows], 0, 1)
            batch["filled"] = np.arange(rows)[:, None] < lengths[None, :]
            batch["loss_mask"] = batch["filled"].copy()
            batch["loss_mask"][:burn_in] = False
        else:
            start = (rng.random(batch_size) * (np.maximum(lengths - seq_len, 0) + 1)).astype(np.int64)
            first = np.maximum(start - burn_in, 0)  # the row the recurrent state starts from
            step = first[None] + np.arange(burn_in + seq_len + 1)[:, None]  # (L + 1, batch) rows of the episodes
            idx = np.minimum(step, self.max_len)  # past the end: padding, masked out below
            for name in self.schema:
                batch[name] = self.data[name][indices[None], idx]
            batch["filled"] = step < lengths[None, :]
            batch["loss_mask"] = batch["filled"] & (step >= start) & (step < start + seq_len)
        batch["indices"] = indices
        return batch

    def _state(self):  # for Snapshot.save / load: the stored episodes and the running ones
        arrays = dict(self.data) | {"_lengths": self.lengths, "_running_steps": self.t}
        arrays |= {f"_running_{name}": arr for name, arr in self.staging.items()}
        meta = {"pos": self.pos, "size": self.size}
        if self.priorities is not None:
            arrays["_priorities"], meta["max_priority"] = self.priorities.state()
        return arrays, meta

    def _ring(self):
        return self.capacity, "episodes"

    def _check_state(self, path, arrays, meta):
        lengths, size = arrays["_lengths"], meta["size"]
        stored = lengths[:size]  # a finished episode has 1..max_len steps; the empty slots 0
        if not 0 <= arrays["_running_steps"].min() <= arrays["_running_steps"].max() <= self.max_len:
            raise BufferInputError(
                f"{path}: the running episodes' steps lie outside 0..max_len={self.max_len}: the file was altered "
                "or not written by save() of a buffer with this max_len"
            )
        if (size and not 1 <= stored.min() <= stored.max() <= self.max_len) or lengths[size:].any():
            raise BufferInputError(
                f"{path}: the episode lengths lie in [{lengths.min()}, {lengths.max()}], expected 1..max_len="
                f"{self.max_len} for the {size} stored episodes and 0 after them: the file was altered or not "
                "written by save() of a buffer with this max_len; start a new buffer"
            )
        if self.priorities is not None:
            self.priorities.check_state(path, arrays["_priorities"], size, meta["max_priority"])

    def _set_state(self, arrays, meta):
        for name, arr in self.data.items():
            arr[...] = arrays[name]
        self.lengths[:] = arrays["_lengths"]
        self.pos, self.size = int(meta["pos"]), int(meta["size"])
        for name, arr in self.staging.items():
            arr[...] = arrays[f"_running_{name}"]
        self.t[:] = arrays["_running_steps"]
        if self.priorities is not None:
            self.priorities.restore(arrays["_priorities"], self.size, meta["max_priority"])

    def drop_running(self):
        """Forget the running episodes (their envs start new ones: a resume on envs that do not save their state)."""
        for arr in self.staging.values():
            arr[...] = 0
        self.t[:] = 0

    def update_priorities(self, indices, priorities):
        """Per-episode priorities (e.g. mean |TD error| over the episode's filled steps)."""
        if self.priorities is None:
            raise BufferInputError("this EpisodeReplayBuffer is uniform: pass alpha=... to prioritize episodes")
        self.priorities.update(indices, priorities, self.size, unit="episodes")
