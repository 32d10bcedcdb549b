"""On-policy rollout storage (MAPPO, IPPO, COMA, VDAC, MFAC, PPO) with GAE / TD(lambda) via the kernels."""

import numpy as np

from buffers import kernels
from buffers.schema import BufferInputError, Schema

__all__ = ["RolloutBuffer"]


def _broadcast_flags(flags, shape, name):
    """Per-env (T, E) or per-agent (T, E, A) flags, broadcast to the values' shape (T, E, ...)."""
    if flags.shape != shape[: flags.ndim]:
        raise BufferInputError(f"{name} has shape {flags.shape}, which does not prefix the values' shape {shape}")
    return np.broadcast_to(flags.reshape(flags.shape + (1,) * (len(shape) - flags.ndim)), shape)


class RolloutBuffer:
    """A fixed-length rollout of `num_steps` steps from `num_envs` envs, time-major ``(T, E, ...)``.

    ``fields`` maps name -> (per-env shape, dtype) (see `buffers.schema`). Typical use::

        rb = RolloutBuffer(128, 16, fields)
        for t in range(128):
            rb.add(obs=..., actions=..., logprobs=..., values=..., rewards=..., terminated=...,
                   truncated=..., final_values=...)
        rb.compute_gae(last_values, gamma=0.99, lam=0.95)
        for mb in rb.minibatches(4, rng): ...
        rb.reset()

    Targets are cut at ``terminated | truncated``; only termination zeroes the future. A truncated
    step bootstraps from ``final_values`` (V of the episode's final observation, stored by the script);
    a rollout with truncations but no such field is refused rather than silently treated as terminated.
    """

    def __init__(self, num_steps, num_envs, fields):
        if num_steps < 1 or num_envs < 1:
            raise BufferInputError(f"num_steps={num_steps} and num_envs={num_envs} must both be >= 1")
        self.num_steps, self.num_envs = int(num_steps), int(num_envs)
        self.schema = Schema(fields)
        self.data = self.schema.allocate((self.num_steps, self.num_envs))
        self.pos = 0
        self.targets = {}  # "advantages" and/or "returns" once computed, shaped like the values

    @property
    def full(self):
        return self.pos == self.num_steps

    def __getitem__(self, name):
        return self.data[name]

    def reset(self):
        """Start a new rollout (storage is reused, not reallocated)."""
        self.pos = 0
        self.targets = {}

    def add(self, **step):
        """Store one step of every env: each declared field with shape (num_envs, *per_env_shape)."""
        if self.full:
            raise BufferInputError(
                f"the rollout is full ({self.num_steps} steps): compute targets, update, then call reset()"
            )
        for name, arr in self.schema.check(step, (self.num_envs,)).items():
            self.data[name][self.pos] = arr
        self.pos += 1

    def _target_inputs(self, last_values, names):
        """The kernels' (T, B) inputs: rewards, values, next values, terminated and episode-end flags.

        Next values are V_{t+1} inside an episode, V(final observation) after a cut, and
        `last_values` after the last step.
        """
        if not self.full:
            raise BufferInputError(f"targets need a full rollout: {self.pos} of {self.num_steps} steps stored so far")
        for key in ("rewards", "values", "terminated"):
            if names[key] not in self.data:
                raise BufferInputError(f"field {names[key]!r} is needed for targets but is not declared")
        v = self.data[names["values"]]
        r = self.data[names["rewards"]].astype(v.dtype, copy=False)
        if r.shape != v.shape:
            raise BufferInputError(f"{names['rewards']!r} has shape {r.shape} but {names['values']!r} has {v.shape}")
        term = _broadcast_flags(self.data[names["terminated"]] != 0, v.shape, names["terminated"])
        ends, truncated = term, self.data.get(names["truncated"])
        if truncated is not None:
            ends = term | _broadcast_flags(truncated != 0, v.shape, names["truncated"])
        last = np.asarray(last_values, dtype=v.dtype)
        if last.shape != v.shape[1:]:
            raise BufferInputError(f"last_values has shape {last.shape}, expected {v.shape[1:]} (like one step)")
        next_values = np.concatenate([v[1:], last[None]], axis=0)
        if truncated is not None and truncated.any():
            if names["final_values"] not in self.data:
                raise BufferInputError(
                    f"the rollout has time-limit truncations but no {names['final_values']!r} field: declare it "
                    "and store V(final observation) so a truncated episode bootstraps instead of being "
                    "treated as terminated"
                )
            np.copyto(next_values, self.data[names["final_values"]], where=ends)
        return [a.reshape(self.num_steps, -1) for a in (r, v, next_values, term, ends)]

    def compute_gae(self, last_values, gamma, lam, **names):
        """GAE advantages and returns (stored as ``targets`` and included in minibatches).

        `last_values`: V of the observation each env stopped in, shape (num_envs, *values_shape).
        Field names can be remapped with keywords ``rewards=, values=, terminated=, truncated=,
        final_values=`` (e.g. a second critic: ``values="values_adversary"``).
        Returns ``(advantages, returns)`` shaped (T, E, *values_shape).
        """
        names = self._names(names)
        r, v, next_values, term, ends = self._target_inputs(last_values, names)
        adv, ret = kernels.gae(r, v, next_values, term, ends, gamma, lam)
        shape = self.data[names["values"]].shape
        self.targets = {"advantages": adv.reshape(shape), "returns": ret.reshape(shape)}
        return self.targets["advantages"], self.targets["returns"]

    def compute_td_lambda(self, last_values, gamma, lam, **names):
        """TD(lambda) returns (COMA / QMIX-style targets), stored as ``targets["returns"]``.

        `values` names the per-step estimates whose *next* entries bootstrap (e.g. target-critic Q of
        the taken action); `last_values` is the estimate after the final step. Names remap as in
        `compute_gae`.
        """
        names = self._names(names)
        r, _, next_values, term, ends = self._target_inputs(last_values, names)
        ret = kernels.td_lambda(r, next_values, term, ends, gamma, lam)
        self.targets = {"returns": ret.reshape(self.data[names["values"]].shape)}
        return self.targets["returns"]

    @staticmethod
    def _names(names):
        defaults = dict(rewards="rewards", values="values", terminated="terminated", truncated="truncated",
                        final_values="final_values")  # fmt: skip
        unknown = set(names) - set(defaults)
        if unknown:
            raise BufferInputError(f"unknown field-name keyword(s) {sorted(unknown)}; accepted: {sorted(defaults)}")
        return defaults | names

    def _arrays(self, fields):
        arrays = {**self.data, **self.targets}
        names = list(arrays) if fields is None else list(fields)
        unknown = [n for n in names if n not in arrays]
        if unknown:
            raise BufferInputError(f"unknown field(s) {unknown}; available: {list(arrays)}")
        return {n: arrays[n] for n in names}

    def minibatches(self, num_minibatches, rng, fields=None):
        """Yield `num_minibatches` shuffled flat batches: dict name -> (about T*E/n, *per_env_shape)."""
        if not self.full:
            raise BufferInputError(f"minibatches need a full rollout: {self.pos} of {self.num_steps} steps stored")
        n = self.num_steps * self.num_envs
        if not 1 <= num_minibatches <= n:
            raise BufferInputError(f"num_minibatches={num_minibatches} must lie in [1, {n}] (T * E samples)")
        flat = {k: v.reshape(n, *v.shape[2:]) for k, v in self._arrays(fields).items()}
        for idx in np.array_split(rng.permutation(n), num_minibatches):  # np.take: half of v[idx]'s time here
            yield {k: np.take(v, idx, axis=0) for k, v in flat.items()}

    def sequences(self, chunk_len, num_minibatches, rng, fields=None):
        """Yield minibatches of whole chunks for recurrent training: dict name -> (chunk_len, N, ...).

        The rollout is cut into T / chunk_len chunks per env; each minibatch holds a random subset of
        the chunks, time-major. The script resets its hidden state inside a chunk where an episode
        ended (its `terminated` / `truncated` fields) and starts each chunk from a stored hidden state.
        """
        if not self.full:
            raise BufferInputError(f"sequences need a full rollout: {self.pos} of {self.num_steps} steps stored")
        if chunk_len < 1 or self.num_steps % chunk_len:
            raise BufferInputError(f"chunk_len={chunk_len} must divide num_steps={self.num_steps}")
        n_chunks = self.num_steps // chunk_len * self.num_envs
        if not 1 <= num_minibatches <= n_chunks:
            raise BufferInputError(f"num_minibatches={num_minibatches} must lie in [1, {n_chunks}] (chunks)")
        chunked = {}
        for k, v in self._arrays(fields).items():
            c = v.reshape(self.num_steps // chunk_len, chunk_len, self.num_envs, *v.shape[2:])
            chunked[k] = c.swapaxes(0, 1).reshape(chunk_len, n_chunks, *v.shape[2:])
        for idx in np.array_split(rng.permutation(n_chunks), num_minibatches):
            yield {k: np.take(v, idx, axis=1) for k, v in chunked.items()}
