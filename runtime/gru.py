"""A GRU run over a whole sequence in one call: the recurrent scripts' training path (mappo, ippo, coma --rnn); and
the one reset of every recurrent script's hidden states where episodes end.

    hs = gru_sequence(gx, h0, w_hh, b_hh, keep)      # every step's hidden state, (L, B, A, H)
    hidden = reset_finished(hidden, step.done)        # the next episodes start from zero states

Training a recurrent actor-critic on chunks of L steps in torch means a Python loop over time: per step a matmul
and a dozen small elementwise ops forward, as many backward, each a dispatch and an autograd node (on MPE's
shapes, 12 rows of 64-128 units, that overhead is the whole cost). Here the input half of the gates (`gx`, one
matmul for all steps) stays in torch, and the recurrence runs in two Numba kernels: the forward pass over time,
saving the gates, and backpropagation through time, one BLAS product per step each way. The weight gradient is
then one batched product over all steps.

`gru_sequence_reference` beside it is the same recurrence as a plain torch loop (the cell of torch.nn.GRU:
r, z = sigmoid(x_r + h_r), sigmoid(x_z + h_z); n = tanh(x_n + r * h_n); h' = (1 - z) n + z h, with h_* =
h W_hh + b_hh): the tests hold the kernels to it, forward and gradients. Tensors that are not float32 on the CPU
(--cuda) take that loop, with a one-line notice.
"""

import warnings

import numba
import numpy as np
import torch


def reset_finished(hidden, done, env_dim: int = 0):
    """`hidden` with the states of the envs whose episode just ended set to zero: the next episode starts from a zero
    state, as the first did. A new tensor (the one given is left as it was); zeros exactly, whatever the state held.

    Args:
        hidden: a tensor of states with the envs along `env_dim` ((E, A, H); nn.GRU's (1, E, A, H) with env_dim=1), a
            dict of them (group -> states, or None where a group has none), or None.
        done: the step's (E,) bool mask of finished episodes, or None (an acting policy's first step: no reset).
    """
    if hidden is None or done is None:
        return hidden
    if isinstance(hidden, dict):
        return {g: reset_finished(h, done, env_dim) for g, h in hidden.items()}
    ended = torch.as_tensor(done, device=hidden.device).view(-1, *(1,) * (hidden.dim() - env_dim - 1))
    return hidden.masked_fill(ended, 0.0)


def gru_sequence(gx, h0, w_hh, b_hh, keep):
    """Hidden states after every step of a GRU over L steps, restarting from zero where `keep` is 0.

    Args:
        gx: (L, B, A, 3H) the input half of the gates, x W_ih + b_ih, for every step (r, z, n blocks).
        h0: (B, A, H) the hidden state before the first step.
        w_hh: (n, H, 3H) recurrent weights, n = 1 (shared by the A agents) or n = A (one per agent).
        b_hh: (n, 1, 3H) recurrent biases.
        keep: (L, B) 0 where an episode began at step i (the state before step i is zeroed), else 1.
    """
    if not all(t.device.type == "cpu" and t.dtype == torch.float32 for t in (gx, h0, w_hh, b_hh)):
        warnings.warn(
            f"recurrent core: {gx.dtype} tensors on {gx.device.type} run the step-by-step torch loop", stacklevel=2
        )  # once per calling line (Python's default filter)
        return gru_sequence_reference(gx, h0, w_hh, b_hh, keep)
    return _GRUSequence.apply(gx, h0, w_hh, b_hh, keep.to(gx.dtype))


def gru_sequence_reference(gx, h0, w_hh, b_hh, keep):
    """The same, one torch step at a time (the reference the kernels are tested against)."""
    h, hs = h0, []
    for gx_t, keep_t in zip(gx.unbind(0), keep.unbind(0), strict=True):  # not gx[i]: its backward fills a whole gx
        h = h * keep_t.view(-1, 1, 1)
        gh = torch.einsum("bah,ahk->bak", h, w_hh.expand(h.shape[1], -1, -1)) + b_hh.transpose(0, 1)
        (xr, xz, xn), (hr, hz, hn) = gx_t.chunk(3, -1), gh.chunk(3, -1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        h = (1 - z) * torch.tanh(xn + r * hn) + z * h
        hs.append(h)
    return torch.stack(hs)


class _GRUSequence(torch.autograd.Function):
    """Kernel layout (G, L, R, .): G weight groups, R rows each. Shared weights: G = 1, R = B * A (one product of
    every agent's rows per step); one network per agent: G = A, R = B."""

    @staticmethod
    def forward(ctx, gx, h0, w_hh, b_hh, keep):
        L, B, A, H3 = gx.shape
        shared = w_hh.shape[0] == 1
        if shared:
            gxk, h0k, keepk = gx.reshape(1, L, B * A, H3), h0.reshape(1, B * A, -1), keep.repeat_interleave(A, 1)
        else:
            gxk, h0k, keepk = gx.permute(2, 0, 1, 3), h0.permute(1, 0, 2), keep
        gxk, h0k, keepk = (np.ascontiguousarray(t.detach().numpy()) for t in (gxk, h0k, keepk))
        G, _, R, _ = gxk.shape
        hs, hp, gates = (np.empty((G, L, R, k * H3 // 3), np.float32) for k in (1, 1, 4))
        w, b = w_hh.detach().contiguous().numpy(), b_hh.detach().reshape(G, H3).contiguous().numpy()
        _forward(gxk, keepk, h0k, w, b, hs, hp, gates)
        ctx.shape, ctx.shared = (L, B, A, H3), shared
        ctx.save_for_backward(*(torch.from_numpy(a) for a in (keepk, hp, gates)), w_hh)
        hs = torch.from_numpy(hs)
        return hs.reshape(L, B, A, -1) if shared else hs.permute(1, 2, 0, 3)

    @staticmethod
    def backward(ctx, grad):
        keep, hp, gates, w_hh = ctx.saved_tensors
        (L, B, A, H3), G = ctx.shape, hp.shape[0]
        grad = grad.reshape(1, L, B * A, -1) if ctx.shared else grad.permute(2, 0, 1, 3)
        dgx, dgh = (np.empty((G, L, hp.shape[2], H3), np.float32) for _ in range(2))
        dh0 = np.empty(hp.shape[:1] + hp.shape[2:], np.float32)
        w_t = np.ascontiguousarray(w_hh.detach().numpy().transpose(0, 2, 1))
        _backward(np.ascontiguousarray(grad.numpy()), keep.numpy(), hp.numpy(), gates.numpy(), w_t, dgx, dgh, dh0)
        dgx, dgh, dh0 = torch.from_numpy(dgx), torch.from_numpy(dgh), torch.from_numpy(dh0)
        dw = torch.bmm(hp.reshape(G, -1, hp.shape[-1]).transpose(1, 2), dgh.reshape(G, -1, H3))
        db = dgh.sum((1, 2)).unsqueeze(1)
        if ctx.shared:
            return dgx.reshape(L, B, A, H3), dh0.reshape(B, A, -1), dw, db, None
        return dgx.permute(1, 2, 0, 3), dh0.permute(1, 0, 2), dw, db, None


@numba.njit(cache=True)
def _exp(x, out, bits):
    """out = exp(x), float32, in a loop LLVM vectorizes (np.exp is a scalar libm call per element here, Numba having
    no vector math library): x = k ln2 + r, |r| <= ln2 / 2, exp(r) by Cephes' expf polynomial (about 1 ulp), 2^k
    written into the exponent bits (x clamped to [-87, 88], float32's range). `bits`: int32 scratch of x's length."""
    scale = bits.view(np.float32)
    for j in range(x.shape[0]):
        v = min(max(x[j], np.float32(-87.0)), np.float32(88.0))
        k = np.floor(v * np.float32(1.4426950408889634) + np.float32(0.5))
        r = v - k * np.float32(0.693359375) + k * np.float32(2.12194440e-4)
        p = np.float32(1.9875691500e-4)
        p = p * r + np.float32(1.3981999507e-3)
        p = p * r + np.float32(8.3334519073e-3)
        p = p * r + np.float32(4.1665795894e-2)
        p = p * r + np.float32(1.6666665459e-1)
        p = p * r + np.float32(5.0000001201e-1)
        bits[j] = (np.int32(k) + np.int32(127)) << np.int32(23)
        y = (p * r * r + r + np.float32(1.0)) * scale[j]
        out[j] = y if x[j] == x[j] else x[j]  # NaN stays NaN (the clamp above would hide it)


@numba.njit(cache=True)
def _forward(gx, keep, h0, w, b, hs, hp, gates):
    """hs[g, i]: the state after step i; hp[g, i]: the (restarted) state before it; gates[g, i]: r, z, n, h_n."""
    G, L, R, H3 = gx.shape
    H = H3 // 3
    one, two = np.float32(1.0), np.float32(2.0)
    pre, e, bits = np.empty(2 * H, np.float32), np.empty(2 * H, np.float32), np.empty(2 * H, np.int32)
    for g in range(G):
        h = h0[g].copy()
        for i in range(L):
            for row in range(R):
                h[row] *= keep[i, row]
            hp[g, i] = h
            gh = np.dot(h, w[g])
            for row in range(R):
                x, s, out, gate = gx[g, i, row], gh[row], h[row], gates[g, i, row]
                for j in range(2 * H):  # r, z = sigmoid(x_r + h_r), sigmoid(x_z + h_z)
                    pre[j] = -(x[j] + s[j] + b[g, j])
                _exp(pre, e, bits)
                for j in range(2 * H):
                    gate[j] = one / (one + e[j])
                for j in range(H):  # n = tanh(x_n + r h_n) = 2 sigmoid(2 (x_n + r h_n)) - 1
                    hn = s[2 * H + j] + b[g, 2 * H + j]
                    gate[3 * H + j] = hn
                    pre[j] = -two * (x[2 * H + j] + gate[j] * hn)
                _exp(pre[:H], e[:H], bits[:H])
                for j in range(H):
                    n = two / (one + e[j]) - one
                    gate[2 * H + j] = n
                    out[j] = n + gate[H + j] * (out[j] - n)
            hs[g, i] = h


@numba.njit(cache=True)
def _backward(grad, keep, hp, gates, w_t, dgx, dgh, dh0):
    """Backpropagation through time: dgx, dgh (L, R, 3H per group) and dh0 from the gradient of every state."""
    G, L, R, H = grad.shape
    for g in range(G):
        dh = np.zeros((R, H), np.float32)
        for i in range(L - 1, -1, -1):
            for row in range(R):
                _backward_row(grad[g, i, row], gates[g, i, row], hp[g, i, row], dgx[g, i, row], dgh[g, i, row], dh[row])
            dh += np.dot(dgh[g, i], w_t[g])
            for row in range(R):
                dh[row] *= keep[i, row]
        dh0[g] = dh


@numba.njit(cache=True)
def _backward_row(grad, gate, prev, dx, ds, dh):
    """One row of one step: the gates' gradients from the state's (dh: the later steps', in place: the part that
    flows through z to the previous state). A function of 1-d rows: faster than the same loop indexing the 4-d
    arrays inline (results/speed/jaxmarl.md's recurrent pair is the end-to-end measure)."""
    H, one = grad.shape[0], np.float32(1.0)
    for j in range(H):
        d = dh[j] + grad[j]
        r, z, n, hn = gate[j], gate[H + j], gate[2 * H + j], gate[3 * H + j]
        dn = d * (one - z) * (one - n * n)
        dz = d * (prev[j] - n) * z * (one - z)
        dr = dn * hn * r * (one - r)
        dx[j], dx[H + j], dx[2 * H + j] = dr, dz, dn
        ds[j], ds[H + j], ds[2 * H + j] = dr, dz, dn * r
        dh[j] = d * z
