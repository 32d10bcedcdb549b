"""Schema-driven buffers: storage, targets, sampling, wrap-around, truncation, padding and misuse."""

import json

import numpy as np
import pytest
import torch

from buffers import (
    BufferInputError,
    EpisodeReplayBuffer,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    RolloutBuffer,
    float_tensor,
    joint_fields,
    joint_transition,
    kernels,
    reference,
    to_torch,
)

E, A, OBS = 3, 2, 4
ROLLOUT_FIELDS = {
    "obs": ((A, OBS), np.float32),
    "actions": ((A,), np.int64),
    "values": ((A,), np.float32),
    "rewards": ((A,), np.float32),
    "terminated": ((A,), np.bool_),
    "truncated": ((), np.bool_),
    "final_values": ((A,), np.float32),
}


def rollout_step(rng, t, truncate=False):
    return dict(
        obs=np.full((E, A, OBS), t, np.float32),
        actions=rng.integers(0, 5, (E, A)),
        values=rng.standard_normal((E, A)).astype(np.float32),
        rewards=rng.standard_normal((E, A)).astype(np.float32),
        terminated=rng.random((E, A)) < 0.1,
        truncated=np.full(E, truncate),
        final_values=rng.standard_normal((E, A)).astype(np.float32),
    )


def filled_rollout(T=8, trunc_at=(3,), seed=0):
    rng = np.random.default_rng(seed)
    rb = RolloutBuffer(T, E, ROLLOUT_FIELDS)
    for t in range(T):
        rb.add(**rollout_step(rng, t, truncate=t in trunc_at))
    return rb


def test_rollout_gae_equals_reference_with_truncation_bootstrap():
    rb = filled_rollout(trunc_at=(3, 7))
    last = np.random.default_rng(9).standard_normal((E, A)).astype(np.float32)
    adv, ret = rb.compute_gae(last, 0.99, 0.95)
    # build the reference inputs by hand: next value is V_{t+1}, V(final obs) after a cut, `last` at the end
    v, term = rb["values"], rb["terminated"]
    end = term | rb["truncated"][:, :, None]
    nv = np.concatenate([v[1:], last[None]])
    nv = np.where(end, rb["final_values"], nv)
    want_adv, want_ret = reference.gae(*(x.reshape(8, -1) for x in (rb["rewards"], v, nv, term, end)), 0.99, 0.95)
    np.testing.assert_allclose(adv.reshape(8, -1), want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret.reshape(8, -1), want_ret, rtol=1e-5, atol=1e-5)
    # the truncated step's target uses V(final obs), not the next episode's first value
    t, e, a = 3, 0, 0
    if not term[t, e, a]:
        delta = rb["rewards"][t, e, a] + 0.99 * rb["final_values"][t, e, a] - v[t, e, a]
        assert adv[t, e, a] == pytest.approx(delta, abs=1e-5)


def test_rollout_td_lambda_matches_kernel():
    rb = filled_rollout(trunc_at=())
    last = np.zeros((E, A), np.float32)
    ret = rb.compute_td_lambda(last, 0.9, 0.8)
    v, term = rb["values"], rb["terminated"]
    nv = np.concatenate([v[1:], last[None]])
    want = kernels.td_lambda(
        rb["rewards"].reshape(8, -1), nv.reshape(8, -1), term.reshape(8, -1), term.reshape(8, -1), 0.9, 0.8
    )
    np.testing.assert_allclose(ret.reshape(8, -1), want, rtol=1e-6)


def test_truncation_without_final_values_is_refused():
    fields = {k: v for k, v in ROLLOUT_FIELDS.items() if k != "final_values"}
    rb = RolloutBuffer(4, E, fields)
    rng = np.random.default_rng(0)
    for t in range(4):
        step = rollout_step(rng, t, truncate=t == 1)
        del step["final_values"]
        rb.add(**step)
    with pytest.raises(BufferInputError, match="truncations but no 'final_values'"):
        rb.compute_gae(np.zeros((E, A)), 0.99, 0.95)


def test_minibatches_cover_every_sample_once_and_carry_targets():
    rb = filled_rollout()
    rb.compute_gae(np.zeros((E, A)), 0.99, 0.95)
    seen = []
    for mb in rb.minibatches(4, np.random.default_rng(0)):
        assert mb["obs"].shape[1:] == (A, OBS) and "advantages" in mb and "returns" in mb
        seen.append(mb["obs"][:, 0, 0])
    steps = np.sort(np.concatenate(seen))
    np.testing.assert_array_equal(steps, np.repeat(np.arange(8), E))  # each (t, e) exactly once


def test_sequences_are_time_major_chunks():
    rb = filled_rollout()
    batches = list(rb.sequences(4, 2, np.random.default_rng(0), fields=["obs"]))
    assert sum(b["obs"].shape[1] for b in batches) == 2 * E  # 8 / 4 chunks per env
    for b in batches:
        t = b["obs"][:, :, 0, 0]  # (chunk_len, N): consecutive steps within every chunk
        np.testing.assert_array_equal(np.diff(t, axis=0), 1)
        assert set(t[0]) <= {0.0, 4.0}


def test_rollout_misuse_errors():
    rb = RolloutBuffer(2, E, ROLLOUT_FIELDS)
    rng = np.random.default_rng(0)
    step = rollout_step(rng, 0)
    with pytest.raises(BufferInputError, match="targets need a full rollout: 0 of 2"):
        rb.compute_gae(np.zeros((E, A)), 0.99, 0.95)
    with pytest.raises(BufferInputError, match=r"missing field\(s\) \['obs'\]"):
        rb.add(**{k: v for k, v in step.items() if k != "obs"})
    with pytest.raises(BufferInputError, match=r"unknown field\(s\) \['logits'\]"):
        rb.add(**step, logits=np.zeros((E, A)))
    with pytest.raises(BufferInputError, match=r"field 'obs' has shape \(3, 4\), expected \(3, 2, 4\)"):
        rb.add(**{**step, "obs": np.zeros((E, OBS))})
    with pytest.raises(BufferInputError, match="'actions' has dtype float64"):
        rb.add(**{**step, "actions": np.zeros((E, A))})
    rb.add(**step)
    rb.add(**step)
    with pytest.raises(BufferInputError, match="the rollout is full"):
        rb.add(**step)
    with pytest.raises(BufferInputError, match="last_values has shape"):
        rb.compute_gae(np.zeros(E), 0.99, 0.95)
    with pytest.raises(BufferInputError, match="chunk_len=3 must divide"):
        next(rb.sequences(3, 1, rng))
    rb.reset()
    assert rb.pos == 0 and not rb.full


REPLAY_FIELDS = {
    "obs": ((OBS,), np.float32),
    "next_obs": ((OBS,), np.float32),
    "actions": ((), np.int64),
    "rewards": ((), np.float32),
    "terminated": ((), np.bool_),
    "truncated": ((), np.bool_),
}


def replay_step(t, end_every=None, terminate=False):
    """Obs encode (step, env) so tests can tell exactly which transition came back."""
    obs = np.array([[t, e, 0, 0] for e in range(E)], np.float32)
    ended = end_every is not None and (t + 1) % end_every == 0
    return dict(
        obs=obs,
        next_obs=obs + np.array([1, 0, 0, 1000 if ended else 0], np.float32),  # final obs marked
        actions=np.full(E, t),
        rewards=np.ones(E, np.float32),
        terminated=np.full(E, ended and terminate),
        truncated=np.full(E, ended and not terminate),
    )


def test_replay_wraps_around_and_keeps_the_newest():
    rb = ReplayBuffer(4 * E, E, REPLAY_FIELDS)
    for t in range(10):
        rb.add(**replay_step(t))
    assert len(rb) == 4 * E and rb.full
    batch = rb.gather(np.arange(len(rb)))
    assert sorted(set(batch["obs"][:, 0].tolist())) == [6, 7, 8, 9]
    np.testing.assert_array_equal(batch["actions"], batch["obs"][:, 0])


def test_replay_next_obs_at_truncation_is_the_final_observation():
    rb = ReplayBuffer(100, E, REPLAY_FIELDS)
    for t in range(6):
        rb.add(**replay_step(t, end_every=3))
    batch = rb.gather(np.arange(len(rb)))
    ended = batch["truncated"]
    assert ended.sum() == 2 * E
    np.testing.assert_array_equal(batch["next_obs"][ended, 3], 1000)  # not the next episode's first obs


@pytest.mark.parametrize("env_id, kwargs", [("simple_speaker_listener_v4", {}),
                                            ("simple_adversary_v3", {"continuous_actions": True})])  # fmt: skip
def test_joint_transitions_of_a_real_env_store_every_group_and_the_final_observation(env_id, kwargs):
    import envs

    env = envs.make(env_id, 2, 0, backend="pettingzoo", max_cycles=5, **kwargs)
    rb, obs = ReplayBuffer(100, 2, joint_fields(env.groups, env.state_shape)), env.reset()
    rng = np.random.default_rng(0)
    for _ in range(5):
        actions = {g: rng.integers(0, s.action_dim, (2, s.n_agents)) if s.discrete
                   else rng.random((2, s.n_agents, s.action_dim), dtype=np.float32)
                   for g, s in env.groups.items()}  # fmt: skip
        step = env.step(actions)
        rb.add(**joint_transition(obs, actions, step, env.groups, state=True))
        obs = step.next
    env.close()
    batch = rb.gather(np.arange(len(rb)))
    for g, s in env.groups.items():
        assert batch[f"obs_{g}"].shape == (10, s.n_agents, *s.obs_shape)
        np.testing.assert_array_equal(batch[f"actions_{g}"][-2:], actions[g])
        # the last step truncated: its next observation is the final one, not the first of the next episode
        np.testing.assert_array_equal(batch[f"next_obs_{g}"][-2:], step.final.obs[g])
        assert not np.array_equal(step.final.obs[g], step.next.obs[g])
    np.testing.assert_array_equal(batch["next_state"][-2:], step.final.state)


def test_replay_uniform_sample_and_errors():
    rb = ReplayBuffer(50, E, REPLAY_FIELDS)
    rng = np.random.default_rng(0)
    with pytest.raises(BufferInputError, match="empty replay buffer"):
        rb.sample(1, rng)
    rb.add(**replay_step(0))
    with pytest.raises(BufferInputError, match="batch_size=4 but the buffer holds 3"):
        rb.sample(4, rng)
    batch = rb.sample(3, rng)
    assert batch["obs"].shape == (3, OBS) and batch["indices"].shape == (3,)


def test_nstep_sampling_matches_kernel_and_stops_at_ends():
    rb = ReplayBuffer(60, E, REPLAY_FIELDS)
    for t in range(12):
        rb.add(**replay_step(t, end_every=5, terminate=True))
    idx = np.arange(len(rb))
    batch = rb.gather(idx, n_step=3, gamma=0.5)
    t = batch["obs"][:, 0].astype(int)
    # episodes end (terminate) at t = 4 and 9; the newest step is 11
    last = np.minimum.reduce([t + 2, np.where(t <= 4, 4, np.where(t <= 9, 9, 11))])
    np.testing.assert_array_equal(batch["next_obs"][:, 0], last + 1)
    m = last - t + 1
    np.testing.assert_allclose(batch["rewards"], (1 - 0.5**m) / 0.5)
    terminal = (last == 4) | (last == 9)
    np.testing.assert_allclose(batch["discounts"], np.where(terminal, 0.0, 0.5**m))


def test_uint8_storage_round_trips_images():
    fields = {"obs": ((2, 2), np.float32), "rewards": ((), np.float32)}
    rb = ReplayBuffer(8, 1, fields, uint8_fields=("obs",))
    assert rb.data["obs"].dtype == np.uint8
    rb.add(obs=np.array([[[0.0, 254.6], [300.0, 17.0]]], np.float32), rewards=np.zeros(1, np.float32))
    out = rb.gather([0])["obs"]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out[0], [[0, 255], [255, 17]])


def test_prioritized_sampling_follows_priorities_and_weights_match_formula():
    fields = {"x": ((), np.int64)}
    rb = PrioritizedReplayBuffer(8, 1, fields, alpha=0.5)
    for i in range(8):
        rb.add(x=np.array([i]))
    errors = np.arange(1, 9, dtype=np.float64)
    rb.update_priorities(np.arange(8), errors)
    rng = np.random.default_rng(0)
    counts = np.zeros(8)
    for _ in range(2000):
        batch = rb.sample(8, rng, beta=0.7)
        np.add.at(counts, batch["x"], 1)
    p = (errors + rb.priorities.eps) ** 0.5
    probs = p / p.sum()
    expected = probs * counts.sum()
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 24.3  # 7 dof, 99.9% quantile
    batch = rb.sample(8, rng, beta=0.7)
    w = (8 * probs[batch["indices"]]) ** -0.7 / (8 * probs.min()) ** -0.7
    np.testing.assert_allclose(batch["weights"], w, rtol=1e-5)
    with pytest.raises(BufferInputError, match="not finite"):
        rb.update_priorities([0], [np.nan])


def test_new_transitions_get_max_priority():
    rb = PrioritizedReplayBuffer(8, 1, {"x": ((), np.int64)}, alpha=1.0)
    rb.add(x=np.array([0]))
    rb.update_priorities([0], [5.0])
    rb.add(x=np.array([1]))
    assert rb.priorities.sum_tree.get(1) == pytest.approx(rb.priorities.sum_tree.get(0))


EPISODE_FIELDS = {"obs": ((OBS,), np.float32), "actions": ((), np.int64), "rewards": ((), np.float32)}


def test_episodes_from_envs_finishing_at_different_steps_are_padded_with_filled_mask():
    eb = EpisodeReplayBuffer(10, max_len=5, num_envs=2, fields=EPISODE_FIELDS)
    for t in range(4):
        eb.add(obs=np.full((2, OBS), t, np.float32), actions=np.array([t, t]), rewards=np.ones(2, np.float32))
        if t == 1:  # env 1 ends after 2 steps; its final observation goes to row 2
            eb.finish([1], obs=np.full((1, OBS), 99, np.float32))
    eb.finish([0], obs=np.full((1, OBS), 77, np.float32))
    assert len(eb) == 2 and eb.lengths[:2].tolist() == [2, 4]
    batch = eb.sample(2, np.random.default_rng(0))
    order = np.argsort(batch["indices"])
    obs, filled = batch["obs"][:, order, 0], batch["filled"][:, order]
    assert obs.shape == (5, 2)  # longest episode (4 steps) + its final observation
    np.testing.assert_array_equal(filled.T, [[1, 1, 0, 0, 0], [1, 1, 1, 1, 0]])
    np.testing.assert_array_equal(obs[:, 0], [0, 1, 99, 0, 0])  # padding is zeros
    np.testing.assert_array_equal(obs[:, 1], [0, 1, 2, 3, 77])  # env 0: steps 0..3, then its final obs
    assert eb.t.tolist() == [0, 2]  # env 1's second episode (steps 2, 3) is still running


def test_episode_windows_burn_in_then_seq_len_steps_then_the_bootstrap_row():
    eb = EpisodeReplayBuffer(20, max_len=9, num_envs=1, fields=EPISODE_FIELDS)
    for length in (9, 2, 6, 4, 9, 1):  # obs = 100 * episode + step; the final observation is 100 * episode + 99
        for t in range(length):
            eb.add(obs=np.full((1, OBS), 100 * len(eb) + t, np.float32), actions=np.array([t]), rewards=np.ones(1))
        eb.finish([0], obs=np.full((1, OBS), 100 * len(eb) + 99, np.float32))
    seq_len, burn_in = 3, 2
    batch = eb.sample(6, np.random.default_rng(0), seq_len=seq_len, burn_in=burn_in)
    assert batch["obs"].shape == (burn_in + seq_len + 1, 6, OBS)
    for b, episode in enumerate(batch["indices"]):
        length, obs = eb.lengths[episode], batch["obs"][:, b, 0] - 100 * episode
        loss, filled = batch["loss_mask"][:, b], batch["filled"][:, b]
        steps = np.flatnonzero(loss)
        assert steps.size == min(seq_len, length)  # a window of seq_len steps, or the whole of a shorter episode
        first, start = obs[0], obs[steps[0]]  # the GRU starts at `first`, the loss at `start`
        assert first == max(start - burn_in, 0) and np.all(np.diff(steps) == 1)
        np.testing.assert_array_equal(filled, first + np.arange(len(obs)) < length)
        real = np.flatnonzero(filled)
        np.testing.assert_array_equal(obs[real], first + real)  # consecutive steps from the window's first row
        after = obs[steps[-1] + 1]  # the row after the last loss step: the next step, or the final observation
        assert after == (start + steps.size if start + steps.size < length else 99)
    whole = eb.sample(6, np.random.default_rng(0), burn_in=2)  # whole episodes: the first burn_in steps only warm up
    np.testing.assert_array_equal(whole["loss_mask"], whole["filled"] & (np.arange(10) >= 2)[:, None])
    with pytest.raises(BufferInputError, match="seq_len=-1"):
        eb.sample(2, np.random.default_rng(0), seq_len=-1)


def test_episode_buffer_errors_and_prioritized_episodes():
    eb = EpisodeReplayBuffer(4, max_len=2, num_envs=1, fields=EPISODE_FIELDS, alpha=0.6)
    rng = np.random.default_rng(0)
    with pytest.raises(BufferInputError, match="empty episode buffer"):
        eb.sample(1, rng)
    with pytest.raises(BufferInputError, match="no steps to finish"):
        eb.finish([0])
    step = dict(obs=np.zeros((1, OBS), np.float32), actions=np.zeros(1, np.int64), rewards=np.zeros(1))
    eb.add(**step)
    eb.add(**step)
    with pytest.raises(BufferInputError, match="longer than max_len=2"):
        eb.add(**step)
    eb.finish([0])
    batch = eb.sample(1, rng, beta=0.5)
    assert batch["weights"].shape == (1,)
    eb.update_priorities(batch["indices"], [0.5])
    with pytest.raises(BufferInputError, match="holds 1 episodes"):
        eb.sample(2, rng)


def assert_same_contents(a, b):
    for name in a.data:
        np.testing.assert_array_equal(a.data[name], b.data[name], err_msg=name)
    assert (a.pos, a.size) == (b.pos, b.size)


@pytest.mark.parametrize("prioritized", [False, True])
def test_replay_snapshot_round_trips_and_cuts_the_newest_episode(tmp_path, prioritized):
    kind = PrioritizedReplayBuffer if prioritized else ReplayBuffer
    rb = kind(5 * E, E, REPLAY_FIELDS)
    for t in range(7):  # wraps around; no episode ends
        rb.add(**replay_step(t))
    if prioritized:
        rb.update_priorities(np.arange(len(rb)), np.arange(len(rb)) % 7 + 0.5)
    rb.save(tmp_path / "replay.npz")
    restored = kind(5 * E, E, REPLAY_FIELDS)
    restored.load(tmp_path / "replay.npz")
    newest = (rb.pos - 1) % rb.rows
    assert restored.data["truncated"][newest].all() and not rb.data["truncated"][newest].any()
    restored.data["truncated"][newest] = False
    assert_same_contents(rb, restored)
    a, b = rb.sample(12, np.random.default_rng(1)), restored.sample(12, np.random.default_rng(1))
    for name in a:  # the same draws, indices and importance weights
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    if prioritized:
        assert restored.priorities.max_priority == rb.priorities.max_priority
        assert restored.priorities.min_tree.min() == rb.priorities.min_tree.min()
    # after the resume the env restarts: an n-step window from the last saved step must not run into it
    restored.data["truncated"][newest] = True
    restored.add(**replay_step(100))
    batch = restored.gather(newest * E + np.arange(E), n_step=3, gamma=0.5)
    np.testing.assert_array_equal(batch["next_obs"][:, 0], 7)  # its own next obs (t = 6 -> 7), not step 100's
    np.testing.assert_allclose(batch["discounts"], 0.5)


def test_episode_snapshot_keeps_stored_episodes_priorities_and_running_ones_which_drop_running_forgets(tmp_path):
    eb = EpisodeReplayBuffer(4, max_len=3, num_envs=2, fields=EPISODE_FIELDS, alpha=0.6)
    step = dict(obs=np.ones((2, OBS), np.float32), actions=np.array([1, 2]), rewards=np.ones(2, np.float32))
    for _ in range(3):
        eb.add(**step)
        eb.finish([0])
    eb.update_priorities(np.arange(3), [0.1, 2.0, 0.7])
    eb.save(tmp_path / "episodes.npz")
    restored = EpisodeReplayBuffer(4, max_len=3, num_envs=2, fields=EPISODE_FIELDS, alpha=0.6)
    restored.load(tmp_path / "episodes.npz")
    assert_same_contents(eb, restored)
    np.testing.assert_array_equal(restored.lengths, eb.lengths)
    assert restored.t.tolist() == [0, 3]  # env 1's running episode came along (its env state is saved too)
    for name in eb.staging:
        np.testing.assert_array_equal(restored.staging[name], eb.staging[name], err_msg=name)
    a, b = eb.sample(2, np.random.default_rng(3), beta=0.5), restored.sample(2, np.random.default_rng(3), beta=0.5)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    restored.drop_running()  # a resume whose envs start new episodes
    assert restored.t.tolist() == [0, 0] and not any(a.any() for a in restored.staging.values())
    assert_same_contents(eb, restored)


def test_snapshot_errors_name_the_problem(tmp_path):
    rb = ReplayBuffer(4 * E, E, REPLAY_FIELDS)
    rb.add(**replay_step(0))
    rb.save(tmp_path / "r.npz")
    with pytest.raises(BufferInputError, match="no buffer snapshot"):
        rb.load(tmp_path / "missing.npz")
    (tmp_path / "bad.npz").write_bytes(b"garbage, not an npz")
    with pytest.raises(BufferInputError, match="unreadable"):
        rb.load(tmp_path / "bad.npz")
    with pytest.raises(BufferInputError, match="field 'obs' was saved as float32 \\(4, 3, 4\\).*same capacity"):
        ReplayBuffer(8 * E, E, REPLAY_FIELDS).load(tmp_path / "r.npz")
    with pytest.raises(BufferInputError, match="holds the fields"):
        ReplayBuffer(4 * E, E, {k: v for k, v in REPLAY_FIELDS.items() if k != "actions"}).load(tmp_path / "r.npz")
    with pytest.raises(BufferInputError, match="holds a ReplayBuffer snapshot; this buffer is a Prior"):
        PrioritizedReplayBuffer(4 * E, E, REPLAY_FIELDS).load(tmp_path / "r.npz")
    assert not list(tmp_path.glob("*.tmp"))


def tamper(src, dst, meta=None, drop=(), **arrays):
    """Copy snapshot `src` to `dst` with metadata entries replaced (None deletes), arrays dropped or replaced."""
    with np.load(src) as f:
        saved = {name: f[name] for name in f.files}
    m = json.loads(bytes(saved["__meta__"]).decode())
    for key, value in (meta or {}).items():
        if value is None:
            del m[key]
        else:
            m[key] = value
    saved["__meta__"] = np.frombuffer(json.dumps(m).encode(), np.uint8)
    saved = {name: a for name, a in (saved | arrays).items() if name not in drop}
    np.savez(dst, **saved)
    return dst


def test_snapshot_larger_than_the_buffer_is_refused_naming_size_and_capacity(tmp_path):
    big = ReplayBuffer(8 * E, E, REPLAY_FIELDS)
    for t in range(6):
        big.add(**replay_step(t))
    big.save(tmp_path / "big.npz")
    rb = ReplayBuffer(4 * E, E, REPLAY_FIELDS)
    with pytest.raises(BufferInputError, match="holds size=6 rows of 3 envs, but this buffer's capacity is 4 rows"):
        rb.load(tmp_path / "big.npz")
    assert len(rb) == 0  # nothing was loaded


@pytest.mark.parametrize(
    "meta, drop, match",
    [
        ({"size": 5, "pos": 0}, (), "holds size=5 rows of 3 envs, but this buffer's capacity is 4 rows"),
        ({"size": -1}, (), "holds size=-1 rows"),
        ({"pos": -1}, (), r"write position pos=-1 with size=2 of 4 rows.*expected 0 <= pos < 4"),
        ({"pos": 3}, (), "write position pos=3 with size=2.*pos == size until full"),
        ({"pos": "2"}, (), "pos='2' and size=2, expected integers"),
        ({"size": None}, (), r"lacks the metadata \['size'\]"),
        ({"kind": None}, (), "holds a None snapshot; this buffer is a ReplayBuffer"),
        ({}, ("actions",), "holds the fields"),
        ({}, ("__meta__",), "unreadable"),
    ],
)
def test_inconsistent_snapshot_metadata_is_one_clear_error(tmp_path, meta, drop, match):
    rb = ReplayBuffer(4 * E, E, REPLAY_FIELDS)
    rb.add(**replay_step(0))
    rb.add(**replay_step(1))
    rb.save(tmp_path / "r.npz")
    bad = tamper(tmp_path / "r.npz", tmp_path / "bad.npz", meta, drop)
    fresh = ReplayBuffer(4 * E, E, REPLAY_FIELDS)
    with pytest.raises(BufferInputError, match=match):
        fresh.load(bad)
    assert len(fresh) == 0


def test_snapshot_with_a_wrong_array_shape_or_non_object_metadata_is_refused(tmp_path):
    rb = ReplayBuffer(4 * E, E, REPLAY_FIELDS)
    rb.add(**replay_step(0))
    rb.save(tmp_path / "r.npz")
    bad = tamper(tmp_path / "r.npz", tmp_path / "bad.npz", obs=np.zeros((4, E, OBS + 1), np.float32))
    with pytest.raises(BufferInputError, match=r"field 'obs' was saved as float32 \(4, 3, 5\)"):
        rb.load(bad)
    np.savez(tmp_path / "list.npz", __meta__=np.frombuffer(b"[1, 2]", np.uint8), **rb.data)
    with pytest.raises(BufferInputError, match="metadata is not a JSON object"):
        rb.load(tmp_path / "list.npz")


@pytest.mark.parametrize(
    "priorities, meta, match",
    [
        (-1.0, {}, r"priorities of the 3 stored slots lie in \[-1.0, .*expected positive finite"),
        (np.nan, {}, "priorities of the 3 stored slots"),
        (None, {"max_priority": float("nan")}, "max_priority=nan, expected a positive finite number"),
        (None, {"max_priority": None}, r"lacks the metadata \['max_priority'\]"),
    ],
)
def test_snapshot_with_bad_priorities_is_refused(tmp_path, priorities, meta, match):
    rb = PrioritizedReplayBuffer(4 * E, E, REPLAY_FIELDS)
    rb.add(**replay_step(0))
    rb.save(tmp_path / "r.npz")
    arrays = {}
    if priorities is not None:
        leaves = rb.priorities.state()[0].copy()
        leaves[1] = priorities
        arrays["_priorities"] = leaves
    bad = tamper(tmp_path / "r.npz", tmp_path / "bad.npz", meta, **arrays)
    fresh = PrioritizedReplayBuffer(4 * E, E, REPLAY_FIELDS)
    with pytest.raises(BufferInputError, match=match):
        fresh.load(bad)
    assert len(fresh) == 0 and fresh.priorities.sum_tree.sum() == 0


def test_episode_snapshot_with_bad_lengths_or_size_is_refused(tmp_path):
    eb = EpisodeReplayBuffer(4, max_len=3, num_envs=1, fields=EPISODE_FIELDS, alpha=0.6)
    eb.add(obs=np.ones((1, OBS), np.float32), actions=np.array([1]), rewards=np.ones(1, np.float32))
    eb.finish([0])
    eb.save(tmp_path / "e.npz")
    fresh = EpisodeReplayBuffer(4, max_len=3, num_envs=1, fields=EPISODE_FIELDS, alpha=0.6)
    for lengths in ([7, 0, 0, 0], [0, 0, 0, 0], [1, 2, 0, 0]):
        bad = tamper(tmp_path / "e.npz", tmp_path / "bad.npz", _lengths=np.array(lengths))
        with pytest.raises(BufferInputError, match=r"episode lengths lie in .* expected 1..max_len=3 for the 1 stored"):
            fresh.load(bad)
    bad = tamper(tmp_path / "e.npz", tmp_path / "bad.npz", _running_steps=np.array([4]))
    with pytest.raises(BufferInputError, match=r"running episodes' steps lie outside 0..max_len=3"):
        fresh.load(bad)
    bad = tamper(tmp_path / "e.npz", tmp_path / "bad.npz", {"size": 9, "pos": 1})
    with pytest.raises(BufferInputError, match="holds size=9 episodes, but this buffer's capacity is 4 episodes"):
        fresh.load(bad)
    assert len(fresh) == 0
    fresh.load(tmp_path / "e.npz")  # the untouched file still loads
    assert len(fresh) == 1


def test_integer_fields_refuse_values_out_of_range_and_accept_the_bounds():
    fields = {"a": ((), np.int8), "u": ((), np.uint8), "done": ((), np.bool_)}
    rb = ReplayBuffer(8, 2, fields)
    ok = dict(a=np.array([-128, 127]), u=np.array([0, 255]), done=np.array([True, False]))
    rb.add(**ok)  # int64 values at the exact bounds of int8 and uint8
    np.testing.assert_array_equal(rb.data["a"][0], [-128, 127])
    np.testing.assert_array_equal(rb.data["u"][0], [0, 255])
    with pytest.raises(BufferInputError, match=r"field 'a' holds 300 \(int64\), outside the range \[-128, 127\]"):
        rb.add(**{**ok, "a": np.array([0, 300])})
    with pytest.raises(BufferInputError, match=r"field 'a' holds -129 .*declared int8: declare a wider dtype"):
        rb.add(**{**ok, "a": np.array([-129, 0])})
    with pytest.raises(BufferInputError, match=r"field 'u' holds -1 \(int8\), outside the range \[0, 255\]"):
        rb.add(**{**ok, "u": np.array([-1, 0], np.int8)})  # narrower but signed: -1 would wrap to 255
    with pytest.raises(BufferInputError, match=r"field 'u' holds 256 \(uint16\)"):
        rb.add(**{**ok, "u": np.array([256, 0], np.uint16)})
    assert len(rb) == 2  # nothing refused was stored
    rb.add(**{**ok, "u": np.array([3, 4], np.int64), "a": np.array([True, False])})  # in range; bool is 0/1
    np.testing.assert_array_equal(rb.data["u"][1], [3, 4])


def test_lossy_kind_changes_are_refused_with_the_cast_to_make():
    fields = {"a": ((), np.int64), "done": ((), np.bool_), "r": ((), np.float32)}
    rb = RolloutBuffer(2, 2, fields)
    ok = dict(a=np.array([1, 2]), done=np.array([True, False]), r=np.array([0.5, 1e3]))  # float64 into float32
    with pytest.raises(BufferInputError, match=r"'a' has dtype float64.*cast explicitly \(`.astype\(np.int64\)`\)"):
        rb.add(**{**ok, "a": np.array([1.0, 2.0])})
    with pytest.raises(BufferInputError, match=r"'done' has dtype int64.*pass booleans \(e.g. `x != 0`\)"):
        rb.add(**{**ok, "done": np.array([1, 0])})
    with pytest.raises(BufferInputError, match="'done' has dtype float64"):
        rb.add(**{**ok, "done": np.array([1.0, 0.0])})
    rb.add(**ok)
    rb.add(**{**ok, "r": np.array([3, 4])})  # integers into a float field
    np.testing.assert_array_equal(rb["r"][:, 1], [1e3, 4])


def test_episode_buffer_checks_integer_ranges_too():
    fields = {"actions": ((), np.int8), "obs": ((OBS,), np.float32)}
    eb = EpisodeReplayBuffer(4, max_len=2, num_envs=1, fields=fields)
    with pytest.raises(BufferInputError, match="field 'actions' holds 1000"):
        eb.add(actions=np.array([1000]), obs=np.zeros((1, OBS), np.float32))
    assert eb.t.tolist() == [0]


@pytest.mark.parametrize(
    "priority, match",
    [
        (-0.5, r"priority -0.5 at position 1, expected \|TD error\| >= 0 and <= 1e\+30: pass the absolute"),
        (np.nan, "priority nan at position 1 is not finite"),
        (np.inf, "priority inf at position 1 is not finite"),
        (1e31, r"priority 1e\+31 at position 1, expected .*<= 1e\+30"),
    ],
)
def test_bad_priorities_are_refused_and_change_nothing(priority, match):
    rb = PrioritizedReplayBuffer(8, 1, {"x": ((), np.int64)}, alpha=0.6)
    for i in range(4):
        rb.add(x=np.array([i]))
    before = rb.priorities.state()
    with pytest.raises(BufferInputError, match=match):
        rb.update_priorities(np.arange(3), [1.0, priority, 2.0])
    after = rb.priorities.state()
    np.testing.assert_array_equal(after[0], before[0])
    assert after[1] == before[1]


@pytest.mark.parametrize(
    "indices, priorities, match",
    [
        ([0, 4], [1.0, 1.0], r"index 4, but only slots \[0, 4\) hold transitions \(capacity 8\)"),  # never written
        ([8], [1.0], r"index 8, but only slots \[0, 4\)"),  # past the capacity
        ([-1], [1.0], "index -1, but only slots"),
        ([0.0, 1.0], [1.0, 1.0], "indices of dtype float64, expected integers"),
        ([0, 1, 2], [1.0, 1.0], "got 3 indices but 2 priorities"),
    ],
)
def test_priority_indices_must_point_to_stored_slots(indices, priorities, match):
    rb = PrioritizedReplayBuffer(8, 1, {"x": ((), np.int64)})
    for i in range(4):
        rb.add(x=np.array([i]))
    with pytest.raises(BufferInputError, match=match):
        rb.update_priorities(indices, priorities)


def test_priority_edge_cases_that_stay_legal():
    rb = PrioritizedReplayBuffer(4, 1, {"x": ((), np.int64)}, alpha=0.5)
    for i in range(4):
        rb.add(x=np.array([i]))
    rb.update_priorities(np.arange(4), [0.0, 1e30, 1.0, 0.0])  # 0 becomes eps^alpha: rare but sampleable
    assert rb.priorities.sum_tree.get(0) == pytest.approx(rb.priorities.eps**0.5)
    assert rb.priorities.max_priority == pytest.approx(1e30)
    batch = rb.sample(4, np.random.default_rng(0))
    np.testing.assert_array_equal(batch["x"], 1)  # the huge priority takes every stratum
    assert np.all(np.isfinite(batch["weights"]) & (batch["weights"] > 0))
    rb.update_priorities(np.array([], np.int64), [])  # an empty update is a no-op
    rb.update_priorities(np.arange(4), 2.0)  # one priority for every index
    np.testing.assert_allclose(rb.priorities.state()[0], (2.0 + rb.priorities.eps) ** 0.5)
    strict = PrioritizedReplayBuffer(4, 1, {"x": ((), np.int64)}, alpha=0.5, eps=0.0)
    strict.add(x=np.array([0]))
    with pytest.raises(BufferInputError, match=r"priority 0.0 at position 0, expected \|TD error\| > 0 \(with eps=0"):
        strict.update_priorities([0], [0.0])
    uniform = PrioritizedReplayBuffer(4, 1, {"x": ((), np.int64)}, alpha=0.0, eps=0.0)
    uniform.add(x=np.array([0]))
    uniform.update_priorities([0], [0.0])  # alpha=0: every leaf is 1
    with pytest.raises(BufferInputError, match="eps=-1.0 must be a finite number >= 0"):
        PrioritizedReplayBuffer(4, 1, {"x": ((), np.int64)}, eps=-1.0)


def test_episode_priorities_only_for_finished_episodes():
    eb = EpisodeReplayBuffer(4, max_len=2, num_envs=1, fields=EPISODE_FIELDS, alpha=0.6)
    eb.add(obs=np.zeros((1, OBS), np.float32), actions=np.zeros(1, np.int64), rewards=np.zeros(1, np.float32))
    eb.finish([0])
    eb.update_priorities([0], [0.0])
    with pytest.raises(BufferInputError, match=r"index 1, but only slots \[0, 1\) hold episodes"):
        eb.update_priorities([1], [1.0])
    with pytest.raises(BufferInputError, match="priority -2.0 at position 0"):
        eb.update_priorities([0], [-2.0])


@pytest.mark.parametrize("n_step", [0, -1, 2.0, True])
def test_n_step_must_be_a_positive_integer(n_step):
    rb = PrioritizedReplayBuffer(4 * E, E, REPLAY_FIELDS)
    rb.add(**replay_step(0))
    rng = np.random.default_rng(0)
    match = rf"n_step={n_step!r}, expected an integer >= 1"
    with pytest.raises(BufferInputError, match=match):
        rb.gather([0], n_step=n_step)
    with pytest.raises(BufferInputError, match=match):
        rb.sample(1, rng, n_step=n_step)
    with pytest.raises(BufferInputError, match=match):
        ReplayBuffer.sample(rb, 1, rng, n_step=n_step)
    assert rb.gather([0], n_step=np.int64(2))["discounts"].shape == (1,)


def test_finish_refuses_a_duplicate_env_id():
    eb = EpisodeReplayBuffer(4, max_len=3, num_envs=3, fields=EPISODE_FIELDS)
    eb.add(obs=np.zeros((3, OBS), np.float32), actions=np.zeros(3, np.int64), rewards=np.zeros(3, np.float32))
    with pytest.raises(BufferInputError, match=r"env_ids \[2, 0, 2\] name env 2 more than once"):
        eb.finish([2, 0, 2])
    assert len(eb) == 0 and eb.t.tolist() == [1, 1, 1]
    eb.finish([2, 0])
    assert len(eb) == 2


def test_to_torch_converts_dtypes_in_one_place():
    batch = {"obs": np.zeros((2, 3)), "mask": np.array([True, False]), "actions": np.array([1, 2], np.int32)}
    t = to_torch(batch)
    assert t["obs"].dtype == torch.float32 and t["mask"].dtype == torch.float32
    assert t["actions"].dtype == torch.int64 and t["mask"].tolist() == [1.0, 0.0]


def test_float_tensor_makes_one_env_array_float32_on_the_device():
    mask = float_tensor(np.array([[True, False]]), "cpu")  # an action mask, as the acting path passes it
    obs = float_tensor([np.float64(0.5), 2], torch.device("cpu"))  # a list and float64 alike
    assert mask.dtype == obs.dtype == torch.float32 and mask.tolist() == [[1.0, 0.0]] and obs.tolist() == [0.5, 2.0]


def test_a_buffer_larger_than_the_machine_is_refused_in_one_line():
    from buffers import ReplayBuffer
    from buffers.schema import BufferInputError, physical_memory

    rows = physical_memory() // 400 + 1  # 400 bytes per step: more than the machine holds
    with pytest.raises(
        BufferInputError, match=r"this buffer needs .* GiB .* of 400 bytes each, more than this machine"
    ):
        ReplayBuffer(rows, 1, {"obs": ((100,), np.float32)})
