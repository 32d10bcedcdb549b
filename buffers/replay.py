"""Off-policy transition storage: uniform `ReplayBuffer` and `PrioritizedReplayBuffer` (segment trees).

Storage is a ring of ``capacity // num_envs`` rows, each row one step of every env: ``(rows, E, ...)``.
Consecutive rows of a column are consecutive steps of one env, which is what n-step targets walk.
Next observations are ordinary declared fields (``next_obs``, ``next_state``...): the script stores the
episode's *final* observation at a time-limit step, never the first observation of the next episode.
"""

import numpy as np

from buffers import kernels
from buffers.schema import BufferInputError, Schema
from buffers.segment_tree import MinTree, SumTree
from buffers.snapshot import Snapshot

__all__ = ["ReplayBuffer", "PrioritizedReplayBuffer", "Priorities", "joint_fields", "joint_transition"]


def joint_fields(groups, state_shape=None):
    """The schema of one joint multi-agent transition, as the off-policy actor-critics store it.

    For every group ``g`` of ``groups`` (name -> ``envs.api.GroupSpec``), with ``A`` its agents: ``obs_g`` and
    ``next_obs_g`` ``(A, *obs_shape)``; ``actions_g``, ``(A,)`` indices or ``(A, action_dim)`` vectors for
    continuous actions; ``rewards_g``, ``terminated_g`` and ``agent_mask_g`` ``(A,)``; with action masks,
    ``avail_g`` and ``next_avail_g`` ``(A, action_dim)``. With ``state_shape``, ``state`` and ``next_state``.
    Truncation is no field: only termination stops a bootstrap.
    """
    fields = {}
    for g, s in groups.items():
        A, obs = s.n_agents, ((s.n_agents, *s.obs_shape), np.float32)
        action = ((A,), np.int64) if s.discrete else ((A, s.action_dim), np.float32)
        fields |= {f"obs_{g}": obs, f"next_obs_{g}": obs, f"actions_{g}": action, f"rewards_{g}": ((A,), np.float32),
                   f"terminated_{g}": ((A,), np.bool_), f"agent_mask_{g}": ((A,), np.bool_)}  # fmt: skip
        if s.has_action_mask:
            fields |= {f"{k}_{g}": ((A, s.action_dim), np.bool_) for k in ("avail", "next_avail")}
    if state_shape is not None:
        fields |= {"state": (state_shape, np.float32), "next_state": (state_shape, np.float32)}
    return fields


def joint_transition(obs, actions, step, groups, state=False):
    """One step of every env as :func:`joint_fields` declares it, for ``ReplayBuffer.add(**...)``.

    ``obs`` is the ``Observation`` acted on, ``actions`` the actions sent (group -> array), ``step`` the
    ``StepResult``. The next observation is ``step.final``'s: the pre-reset one where an episode ended, never the
    first observation of the next episode. ``state``: also the global state and the next one.
    """
    final = step.final
    sources = dict(obs=obs.obs, next_obs=final.obs, actions=actions, rewards=step.rewards, terminated=step.terminated,
                   agent_mask=obs.agent_mask, avail=obs.avail_actions, next_avail=final.avail_actions)  # fmt: skip
    out = {f"{k}_{g}": v[g] for k, v in sources.items() for g in groups if g in v}
    return out | ({"state": obs.state, "next_state": final.state} if state else {})


class ReplayBuffer(Snapshot):
    """Uniform experience replay over vectorized envs.

    ``fields``: name -> (per-env shape, dtype). ``uint8_fields``: names of image fields stored as uint8
    (values rounded and clipped to [0, 255]) and returned in their declared dtype, a quarter of the memory.

    n-step sampling (``n_step > 1``) needs scalar-per-env fields named ``rewards``, ``terminated`` and
    ``truncated``; it returns the discounted n-step reward sum as ``rewards``, the bootstrap factor
    ``discounts`` (gamma^m, or 0 after a termination) and every ``next_*`` field from the step whose next
    observation bootstraps. The window stops at episode ends and at the newest stored step.
    """

    def __init__(self, capacity, num_envs, fields, uint8_fields=()):
        if num_envs < 1 or capacity < num_envs:
            raise BufferInputError(f"capacity={capacity} must be >= num_envs={num_envs} >= 1 (one row per step)")
        self.rows, self.num_envs = int(capacity) // int(num_envs), int(num_envs)
        self.schema = Schema(fields)
        bad = [n for n in uint8_fields if n not in self.schema]
        if bad:
            raise BufferInputError(f"uint8_fields {bad} are not declared fields ({list(self.schema)})")
        self.uint8_fields = tuple(uint8_fields)
        self.data = self.schema.allocate((self.rows, self.num_envs), {n: np.uint8 for n in uint8_fields})
        self.pos = 0  # next row to write
        self.size = 0  # rows stored

    @property
    def capacity(self):
        return self.rows * self.num_envs

    @property
    def full(self):
        return self.size == self.rows

    def __len__(self):
        """Number of stored transitions (rows x envs)."""
        return self.size * self.num_envs

    def add(self, **step):
        """Store one step of every env (each declared field, shape (num_envs, *per_env_shape)).

        Returns the flat indices (row * num_envs + env) written, e.g. to set their priorities.
        """
        for name, arr in self.schema.check(step, (self.num_envs,)).items():
            if name in self.uint8_fields and arr.dtype != np.uint8:
                arr = np.clip(np.rint(arr), 0, 255)
            self.data[name][self.pos] = arr
        written = self.pos * self.num_envs + np.arange(self.num_envs)
        self.pos = (self.pos + 1) % self.rows
        self.size = min(self.size + 1, self.rows)
        return written

    def _state(self):  # for Snapshot.save / load
        return dict(self.data), {"pos": self.pos, "size": self.size}

    def _ring(self):
        return self.rows, f"rows of {self.num_envs} envs"

    def _set_state(self, arrays, meta):
        for name, arr in self.data.items():
            arr[...] = arrays[name]
        self.pos, self.size = int(meta["pos"]), int(meta["size"])
        if "truncated" in self.schema and self.size:  # the run goes on from a reset: the newest episode was cut
            self.data["truncated"][(self.pos - 1) % self.rows] = True  # so n-step windows stop there

    def _check_sample(self, batch_size):
        if self.size == 0:
            raise BufferInputError("cannot sample from an empty replay buffer: add transitions first")
        if not 1 <= batch_size <= len(self):
            raise BufferInputError(
                f"batch_size={batch_size} but the buffer holds {len(self)} transitions: sample at most "
                "that many (start learning later, e.g. a larger --learning-starts)"
            )

    def sample(self, batch_size, rng, n_step=1, gamma=0.99):
        """A uniform batch (with replacement): dict name -> (batch, *shape), plus ``indices``."""
        self._check_sample(batch_size)
        return self.gather(rng.integers(0, len(self), batch_size), n_step, gamma)

    def gather(self, indices, n_step=1, gamma=0.99):
        """The transitions at flat `indices` (row * num_envs + env) as one fancy-indexed copy per field."""
        check_n_step(n_step)
        indices = np.asarray(indices, dtype=np.int64)
        rows, envs = np.divmod(indices, self.num_envs)
        batch = {name: self._read(name, rows, envs) for name in self.schema}
        if n_step > 1:
            self._nstep(batch, rows, envs, int(n_step), gamma)
        batch["indices"] = indices
        return batch

    def _read(self, name, rows, envs):
        # take() on the flat (rows * envs, *shape) view: ~4x faster than arr[rows, envs] for a batch of 256
        arr = self.data[name]
        out = arr.reshape(-1, *arr.shape[2:]).take(rows * self.num_envs + envs, axis=0)
        if name in self.uint8_fields:
            out = out.astype(self.schema.fields[name][1])
        return out

    def _nstep(self, batch, rows, envs, n, gamma):
        """Replace rewards by n-step sums, add ``discounts``, read ``next_*`` at the bootstrap step."""
        for name in ("rewards", "terminated", "truncated"):
            if name not in self.schema or self.schema.shape(name) != ():
                raise BufferInputError(
                    f"n-step sampling needs a scalar-per-env field {name!r} (shape ()); "
                    f"declared: {self.schema.fields.get(name)}"
                )
        k = np.arange(n)[:, None]
        window = (rows[None] + k) % self.rows  # (n, batch): the next n rows of each sampled env
        oldest = self.pos if self.full else 0
        age = (rows - oldest) % self.rows  # 0 for the oldest stored row
        newest = age[None] + k == self.size - 1  # the window must stop at the newest stored step
        rewards = self.data["rewards"][window, envs]
        terminated = self.data["terminated"][window, envs] != 0
        episode_end = terminated | (self.data["truncated"][window, envs] != 0) | newest
        dtype = np.float64 if rewards.dtype == np.float64 else np.float32
        sums, discounts, last = kernels.nstep_returns(rewards.astype(dtype), terminated, episode_end, gamma, n)
        boot_rows = window[last[0], np.arange(len(rows))]
        batch["rewards"] = sums[0].astype(rewards.dtype)
        batch["discounts"] = discounts[0]
        for name in self.schema:
            if name.startswith("next_"):
                batch[name] = self._read(name, boot_rows, envs)


def check_n_step(n_step):
    """Refuse an n-step length that is not an integer >= 1 (0 would silently mean one-step targets)."""
    if isinstance(n_step, bool) or not isinstance(n_step, int | np.integer) or n_step < 1:
        raise BufferInputError(
            f"n_step={n_step!r}, expected an integer >= 1 (1 = one-step targets): pass the n-step length, "
            "e.g. --n-step 3"
        )


MAX_PRIORITY = 1e30  # a larger |TD error| means diverged values; beside it every ordinary priority is lost in
# the tree's float64 sums, and it would become the max priority given to every new transition


class Priorities:
    """Proportional priorities over `capacity` slots (Schaul et al. 2016): P(i) = p_i^alpha / sum_j p_j^alpha.

    New slots get the largest priority seen so far, so every transition is replayed at least once.
    Shared by `PrioritizedReplayBuffer` (transitions) and `EpisodeReplayBuffer` (whole episodes).

    A raw priority p (|TD error|) must be finite, in [0, 1e30]; the tree stores (p + eps)^alpha. So p = 0
    is allowed while eps > 0 (the slot keeps the small probability eps^alpha); with eps = 0 and alpha > 0
    it is refused, since the slot could never be sampled again and the largest importance weight would be
    infinite. Every stored slot's leaf is therefore positive.
    """

    def __init__(self, capacity, alpha, eps=1e-6):
        if not 0.0 <= alpha <= 1.0:
            raise BufferInputError(f"alpha={alpha} must lie in [0, 1] (0 = uniform, 1 = fully proportional)")
        if not 0.0 <= eps < np.inf:
            raise BufferInputError(f"eps={eps} must be a finite number >= 0 (the constant added to every |TD error|)")
        self.alpha, self.eps = float(alpha), float(eps)
        self.sum_tree, self.min_tree = SumTree(capacity), MinTree(capacity)
        self.max_priority = 1.0

    def add(self, indices):
        p = self.max_priority**self.alpha
        self.sum_tree.update(indices, p)
        self.min_tree.update(indices, p)

    def update(self, indices, priorities, count, unit="transitions"):
        """Set raw priorities (|TD error| >= 0) of stored slots `indices`; slots [0, count) hold data.

        Checked with a min and a max of each array: integer indices in [0, count) (a never-written slot
        would be sampled as an all-zero transition), one priority per index (or one for all), and every
        priority finite, in [0, 1e30] (and > 0 when eps = 0); a violation raises a `BufferInputError`.
        """
        indices = np.asarray(indices).reshape(-1)
        priorities = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if indices.size == 0 and priorities.size <= 1:
            return
        if priorities.size not in (1, indices.size):
            raise BufferInputError(
                f"update_priorities got {indices.size} indices but {priorities.size} priorities: pass one "
                "priority per sampled index (e.g. the batch's |TD errors|, shape (batch,))"
            )
        if indices.dtype.kind not in "iu":
            raise BufferInputError(
                f"update_priorities got indices of dtype {indices.dtype}, expected integers: pass the "
                "'indices' array of the sampled batch"
            )
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= count:
            raise BufferInputError(
                f"update_priorities got index {lo if lo < 0 else hi}, but only slots [0, {count}) hold {unit} "
                f"(capacity {self.sum_tree.capacity}): pass the 'indices' of a batch sampled from this buffer"
            )
        lo, hi = priorities.min(), priorities.max()  # NaN propagates into both and fails every comparison
        zero_ok = self.eps > 0 or self.alpha == 0  # (0 + eps)^alpha > 0
        if not (0 <= lo and hi <= MAX_PRIORITY) or (lo == 0 and not zero_ok):
            finite = np.isfinite(priorities)
            if not finite.all():
                bad = int(np.flatnonzero(~finite)[0])
                raise BufferInputError(
                    f"priority {priorities[bad]} at position {bad} is not finite: the TD errors contain "
                    "NaN or inf (check the loss, learning rate and reward scale)"
                )
            bad_mask = (priorities < 0) | (priorities > MAX_PRIORITY) | ((priorities == 0) & (not zero_ok))
            bad = int(np.flatnonzero(bad_mask)[0])
            least = ">= 0" if zero_ok else "> 0 (with eps=0 a zero priority could never be sampled again)"
            raise BufferInputError(
                f"priority {priorities[bad]} at position {bad}, expected |TD error| {least} and <= {MAX_PRIORITY:g}: "
                "pass the absolute TD errors, and lower the learning rate or reward scale if they are this large"
            )
        p = (priorities + self.eps) ** self.alpha
        self.sum_tree.update(indices, p)
        self.min_tree.update(indices, p)
        self.max_priority = max(self.max_priority, float(hi) + self.eps)

    def state(self):
        """Every slot's priority^alpha (for a snapshot) and the largest raw priority seen."""
        return self.sum_tree.get(np.arange(self.sum_tree.capacity)), self.max_priority

    def check_state(self, path, leaves, count, max_priority):
        """Refuse saved priorities `restore` could not use: a stored leaf <= 0, non-finite sums, a bad max."""
        stored = leaves[:count]
        if count and not (stored.min() > 0 and np.isfinite(stored.sum())):
            raise BufferInputError(
                f"{path}: the priorities of the {count} stored slots lie in [{stored.min()}, {stored.max()}], "
                "expected positive finite values: the file was altered or not written by save(); start a new buffer"
            )
        if isinstance(max_priority, bool) or not isinstance(max_priority, int | float) or not 0 < max_priority < np.inf:
            raise BufferInputError(
                f"{path}: max_priority={max_priority!r}, expected a positive finite number: the file was altered "
                "or not written by save(); start a new buffer"
            )

    def restore(self, leaves, count, max_priority):
        """Undo `state()`: the first `count` slots hold data, the others are empty."""
        slots = np.arange(self.sum_tree.capacity)
        self.sum_tree.update(slots, np.where(slots < count, leaves, 0.0))
        self.min_tree.update(slots, np.where(slots < count, leaves, np.inf))
        self.max_priority = float(max_priority)

    def sample(self, batch_size, beta, rng, count):
        """Stratified proportional indices and their importance weights (N P(i))^-beta / max_j w_j."""
        if not 0.0 <= beta <= 1.0:
            raise BufferInputError(f"beta={beta} must lie in [0, 1]")
        indices = self.sum_tree.sample_stratified(batch_size, rng)
        total = self.sum_tree.sum()
        probs = self.sum_tree.get(indices) / total
        max_weight = (count * self.min_tree.min() / total) ** -beta  # from the least likely slot
        weights = (count * probs) ** -beta / max_weight
        return indices, weights.astype(np.float32)


class PrioritizedReplayBuffer(ReplayBuffer):
    """`ReplayBuffer` sampling transitions in proportion to priority^alpha, with importance weights.

    ``sample(batch, rng, beta)`` returns ``weights`` and ``indices``; pass the new |TD errors| to
    ``update_priorities(indices, errors)`` (see `Priorities` for what a priority may be). Anneal beta to 1
    over training (the script's schedule).
    """

    def __init__(self, capacity, num_envs, fields, alpha=0.6, uint8_fields=(), eps=1e-6):
        super().__init__(capacity, num_envs, fields, uint8_fields)
        self.priorities = Priorities(self.capacity, alpha, eps)

    def add(self, **step):
        written = super().add(**step)
        self.priorities.add(written)
        return written

    def sample(self, batch_size, rng, beta=0.4, n_step=1, gamma=0.99):
        self._check_sample(batch_size)
        indices, weights = self.priorities.sample(batch_size, beta, rng, len(self))
        batch = self.gather(indices, n_step, gamma)
        batch["weights"] = weights
        return batch

    def update_priorities(self, indices, priorities):
        """Raw priorities (|TD errors|, finite, >= 0) for the flat `indices` of a sampled batch."""
        self.priorities.update(indices, priorities, len(self))

    def _state(self):
        arrays, meta = super()._state()
        leaves, meta["max_priority"] = self.priorities.state()
        return arrays | {"_priorities": leaves}, meta

    def _check_state(self, path, arrays, meta):
        count = meta["size"] * self.num_envs
        self.priorities.check_state(path, arrays["_priorities"], count, meta["max_priority"])

    def _set_state(self, arrays, meta):
        super()._set_state(arrays, meta)
        self.priorities.restore(arrays["_priorities"], len(self), meta["max_priority"])
