"""Compiled kernels (buffers.kernels) against their reference loops (buffers.reference), plus properties."""

import numpy as np
import pytest

from buffers import kernels, reference

DTYPES = [np.float32, np.float64]
SIZES = [(1, 1), (1, 7), (5, 3), (64, 16), (200, 5)]
TOL = {np.float32: dict(rtol=2e-4, atol=2e-4), np.float64: dict(rtol=1e-10, atol=1e-10)}


def make_inputs(T, B, dtype, seed, p_term=0.05, p_trunc=0.05):
    rng = np.random.default_rng(seed)
    rewards = rng.standard_normal((T, B)).astype(dtype)
    values = rng.standard_normal((T, B)).astype(dtype)
    next_values = rng.standard_normal((T, B)).astype(dtype)
    terminated = rng.random((T, B)) < p_term
    episode_end = terminated | (rng.random((T, B)) < p_trunc)
    return rewards, values, next_values, terminated, episode_end


def edge_flags(T, B, case):
    """Flag patterns named in the spec: (terminated, episode_end)."""
    zeros = np.zeros((T, B), bool)
    if case == "no_ends":
        return zeros, zeros
    if case == "all_terminal":
        ones = np.ones((T, B), bool)
        return ones, ones
    end = zeros.copy()
    if case == "trunc_mid":
        end[T // 2] = True
    elif case == "trunc_last":
        end[-1] = True
    elif case == "term_mid":
        term = zeros.copy()
        term[T // 2] = True
        return term, term.copy()
    return zeros, end


CASES = ["random", "no_ends", "all_terminal", "trunc_mid", "trunc_last", "term_mid"]


def inputs_for(case, T, B, dtype, seed=0):
    r, v, nv, term, end = make_inputs(T, B, dtype, seed)
    if case != "random":
        term, end = edge_flags(T, B, case)
    return r, v, nv, term, end


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,B", SIZES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.0, 0.95), (0.9, 0.0), (0.9, 1.0)])
def test_gae_td_lambda_discounted_match_reference(dtype, T, B, case, gamma, lam):
    r, v, nv, term, end = inputs_for(case, T, B, dtype, seed=T * 31 + B)
    adv, ret = kernels.gae(r, v, nv, term, end, gamma, lam)
    adv_ref, ret_ref = reference.gae(r, v, nv, term, end, gamma, lam)
    assert adv.dtype == dtype and ret.dtype == dtype
    np.testing.assert_allclose(adv, adv_ref, **TOL[dtype])
    np.testing.assert_allclose(ret, ret_ref, **TOL[dtype])

    td = kernels.td_lambda(r, nv, term, end, gamma, lam)
    assert td.dtype == dtype
    np.testing.assert_allclose(td, reference.td_lambda(r, nv, term, end, gamma, lam), **TOL[dtype])

    dr = kernels.discounted_returns(r, nv, term, end, gamma)
    np.testing.assert_allclose(dr, reference.discounted_returns(r, nv, term, end, gamma), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,B", SIZES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("n", [1, 3, 10])
@pytest.mark.parametrize("gamma", [0.0, 0.9])
def test_nstep_matches_reference(dtype, T, B, case, n, gamma):
    r, _, _, term, end = inputs_for(case, T, B, dtype, seed=T + 7 * B)
    got = kernels.nstep_returns(r, term, end, gamma, n)
    want = reference.nstep_returns(r, term, end, gamma, n)
    np.testing.assert_allclose(got[0], want[0], **TOL[dtype])
    np.testing.assert_allclose(got[1], want[1], **TOL[dtype])
    np.testing.assert_array_equal(got[2], want[2])
    assert got[2].dtype == np.int64


@pytest.mark.parametrize("dtype", DTYPES)
def test_gae_plus_values_equals_td_lambda(dtype):
    """With next_values[t] == values[t+1] inside episodes, GAE + V is the TD(lambda) return."""
    T, B = 50, 6
    r, v, nv, term, end = make_inputs(T, B, dtype, seed=3, p_term=0.05, p_trunc=0.05)
    nv[:-1] = np.where(end[:-1], nv[:-1], v[1:])  # consistent values except where an episode ends
    adv, ret = kernels.gae(r, v, nv, term, end, 0.97, 0.9)
    np.testing.assert_allclose(ret, adv + v, **TOL[dtype])
    np.testing.assert_allclose(ret, kernels.td_lambda(r, nv, term, end, 0.97, 0.9), **TOL[dtype])


def test_lambda_zero_is_one_step_td_error():
    r, v, nv, term, end = make_inputs(30, 4, np.float64, seed=4)
    adv, _ = kernels.gae(r, v, nv, term, end, 0.9, 0.0)
    np.testing.assert_allclose(adv, r + 0.9 * (1 - term) * nv - v)
    np.testing.assert_allclose(kernels.td_lambda(r, nv, term, end, 0.9, 0.0), r + 0.9 * (1 - term) * nv)


def test_lambda_one_is_discounted_return():
    r, _, nv, term, end = make_inputs(30, 4, np.float64, seed=5)
    np.testing.assert_allclose(
        kernels.td_lambda(r, nv, term, end, 0.9, 1.0), kernels.discounted_returns(r, nv, term, end, 0.9)
    )


def test_closed_form_single_terminal_reward():
    """Reward 1 only at a terminal step T-1, constant value c: A_t = gamma^(T-1-t) - c for lam=1."""
    T, gamma, c = 10, 0.9, 0.5
    r = np.zeros((T, 1))
    r[-1] = 1.0
    term = np.zeros((T, 1), bool)
    term[-1] = True
    v = np.full((T, 1), c)
    adv, ret = kernels.gae(r, v, v, term, term, gamma, 1.0)
    expected = gamma ** np.arange(T - 1, -1, -1)[:, None]
    np.testing.assert_allclose(ret, expected)
    np.testing.assert_allclose(adv, expected - c)


def test_truncation_bootstraps_but_termination_does_not():
    """Same rewards and flags except terminated-vs-truncated at step 2: only truncation keeps V(final)."""
    r = np.zeros((4, 1))
    nv = np.full((4, 1), 10.0)
    end = np.zeros((4, 1), bool)
    end[2] = True
    truncated_ret = kernels.td_lambda(r, nv, np.zeros_like(end), end, 0.5, 0.5)
    terminated_ret = kernels.td_lambda(r, nv, end, end, 0.5, 0.5)
    assert truncated_ret[2, 0] == pytest.approx(5.0)  # 0 + 0.5 * V(final obs)
    assert terminated_ret[2, 0] == 0.0


def test_nstep_stops_at_episode_end_and_terminal():
    r = np.ones((6, 1))
    term = np.zeros((6, 1), bool)
    term[2] = True
    sums, disc, last = kernels.nstep_returns(r, term, term, 0.5, 3)
    assert last[:, 0].tolist() == [2, 2, 2, 5, 5, 5]
    np.testing.assert_allclose(sums[:, 0], [1.75, 1.5, 1.0, 1.75, 1.5, 1.0])
    np.testing.assert_allclose(disc[:, 0], [0.0, 0.0, 0.0, 0.125, 0.25, 0.5])


def test_flags_accept_float_and_int_arrays():
    r, v, nv, term, end = make_inputs(20, 3, np.float32, seed=6)
    a1, _ = kernels.gae(r, v, nv, term, end, 0.99, 0.95)
    a2, _ = kernels.gae(r, v, nv, term.astype(np.float32), end.astype(np.int8), 0.99, 0.95)
    np.testing.assert_array_equal(a1, a2)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x, f: kernels.gae(x, x[:-1], x, f, f, 0.9, 0.9), "values has shape"),
        (lambda x, f: kernels.gae(x[:, 0], x, x, f, f, 0.9, 0.9), "time-major"),
        (lambda x, f: kernels.gae(x.astype(int), x, x, f, f, 0.9, 0.9), "float32 or float64"),
        (lambda x, f: kernels.td_lambda(x, x, f[:, :1], f, 0.9, 0.9), "terminated has shape"),
        (lambda x, f: kernels.td_lambda(x, x, f, f, 1.5, 0.9), "gamma"),
        (lambda x, f: kernels.nstep_returns(x, f, f, 0.9, 0), "positive integer"),
        (lambda x, f: kernels.gae(x[:0], x[:0], x[:0], f[:0], f[:0], 0.9, 0.9), "T=0"),
    ],
)
def test_bad_inputs_raise_clear_errors(call, match):
    x = np.zeros((4, 3), np.float32)
    f = np.zeros((4, 3), bool)
    with pytest.raises((ValueError, TypeError), match=match):
        call(x, f)


# --- the neighbour mean action of mean-field MARL ---


@pytest.mark.parametrize("radius", [None, 0.0, 1.5, 3.0, 100.0])
@pytest.mark.parametrize("E, A, n", [(1, 1, 3), (3, 7, 5), (2, 30, 21)])
def test_neighbour_mean_actions_match_reference(E, A, n, radius):
    rng = np.random.default_rng(E * 100 + A)
    positions = rng.integers(0, 6, (E, A, 2))
    alive = rng.random((E, A)) < 0.7  # dead agents neither get nor give a mean
    actions = rng.integers(0, n, (E, A))
    got = kernels.neighbour_mean_actions(positions, alive, actions, n, radius)
    want = reference.neighbour_mean_actions(positions, alive, actions, n, radius)
    np.testing.assert_allclose(got, want, atol=1e-6)
    has = got.sum(-1)  # a distribution where an agent has a living neighbour, zeros elsewhere (and for the dead)
    assert np.allclose(has[has > 0], 1.0) and (has[~alive] == 0).all()


def test_neighbour_mean_actions_by_hand():
    positions = np.array([[[0, 0], [1, 0], [5, 5], [0, 2]]])
    alive = np.array([[True, True, True, False]])
    actions = np.array([[0, 1, 2, 1]])
    got = kernels.neighbour_mean_actions(positions, alive, actions, 3, radius=2.0)
    # agent 0 sees 1 (distance 1), not 2 (far) nor 3 (dead); agent 2 sees nobody
    np.testing.assert_array_equal(got[0], [[0, 1, 0], [1, 0, 0], [0, 0, 0], [0, 0, 0]])
    group = kernels.neighbour_mean_actions(None, alive, actions, 3)  # --mean-over group: every other living agent
    np.testing.assert_allclose(group[0, 0], [0, 0.5, 0.5])


@pytest.mark.parametrize(
    "args, match",
    [
        ((np.zeros((1, 2, 2)), np.ones((1, 2)), np.array([[0, 3]]), 3, 1.0), r"outside \[0, 3\)"),
        ((np.zeros((1, 3, 2)), np.ones((1, 2)), np.array([[0, 1]]), 3, 1.0), "positions has shape"),
        ((np.zeros((1, 2, 2)), np.ones((2, 2)), np.array([[0, 1]]), 3, 1.0), "alive has shape"),
        ((np.zeros((1, 2, 2)), np.ones((1, 2)), np.array([[0, 1]]), 3, -1.0), "radius=-1.0 must be >= 0"),
        ((np.zeros((1, 2, 2)), np.ones((1, 2)), np.array([0.0, 1.0]), 3, 1.0), "expected \\(E, A\\) integers"),
    ],
)
def test_neighbour_mean_actions_bad_inputs(args, match):
    with pytest.raises(ValueError, match=match):
        kernels.neighbour_mean_actions(*args)
