"""runtime/gru.py: the sequence kernels equal the step-by-step torch loop, forward and backward."""

import numpy as np
import pytest
import torch

from runtime.gru import gru_sequence, gru_sequence_reference


def inputs(n, L=30, B=4, A=3, H=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    gx = torch.randn(L, B, A, 3 * H, generator=g, dtype=dtype).requires_grad_()
    h0 = torch.randn(B, A, H, generator=g, dtype=dtype).requires_grad_()
    w = (0.3 * torch.randn(n, H, 3 * H, generator=g, dtype=dtype)).requires_grad_()
    b = torch.randn(n, 1, 3 * H, generator=g, dtype=dtype).requires_grad_()
    keep = (torch.rand(L, B, generator=g) > 0.15).to(dtype)  # episodes begin at random steps in every row
    keep[0, 0] = 0
    return gx, h0, w, b, keep


def outputs_and_grads(f, gx, h0, w, b, keep):
    for p in (gx, h0, w, b):
        p.grad = None
    hs = f(gx, h0, w, b, keep)
    (hs * torch.linspace(-1, 1, hs.numel(), dtype=hs.dtype).view(hs.shape)).sum().backward()
    return [hs.detach(), *(p.grad.clone() for p in (gx, h0, w, b))]


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per-agent"])
def test_the_sequence_kernels_equal_the_step_by_step_loop(shared):
    """States, and the gradients of the gate inputs, the first state, the weights and the biases."""
    args = inputs(1 if shared else 3)
    got, want = outputs_and_grads(gru_sequence, *args), outputs_and_grads(gru_sequence_reference, *args)
    for name, a, e in zip(["states", "d gx", "d h0", "d w_hh", "d b_hh"], got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5, msg=name)


def test_a_restart_cuts_the_gradient_to_earlier_steps():
    gx, h0, w, b, keep = inputs(1, L=6)
    keep[:] = 1
    keep[3] = 0  # every row restarts before step 3
    hs = gru_sequence(gx, h0, w, b, keep)
    hs[3:].sum().backward()
    assert gx.grad[:3].abs().max() == 0 and h0.grad.abs().max() == 0 and gx.grad[3:].abs().min() > 0


def test_other_dtypes_take_the_reference_loop_with_a_notice():
    args = inputs(1, L=5, dtype=torch.float64)
    with pytest.warns(UserWarning, match="float64 tensors on cpu run the step-by-step torch loop"):
        hs = gru_sequence(*args)
    torch.testing.assert_close(hs, gru_sequence_reference(*args))


def test_the_kernels_exp_is_float32_exact_and_keeps_nan():
    """The forward kernel's vectorizable exp (runtime.gru._exp) within 2e-7 of float64's exp over float32's range
    (np.exp in float32: ~2e-7), a NaN kept (a diverging run must still reach the loss's finiteness check)."""
    from runtime.gru import _exp

    x = np.concatenate([np.linspace(-87, 88, 200_001, dtype=np.float32), [np.nan]]).astype(np.float32)
    out, bits = np.empty_like(x), np.empty(x.shape, np.int32)
    _exp(x, out, bits)
    exact = np.exp(x[:-1].astype(np.float64))
    assert np.max(np.abs(out[:-1] - exact) / exact) < 2e-7
    assert np.isnan(out[-1])
