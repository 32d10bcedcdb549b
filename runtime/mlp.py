"""The acting pass of a feed-forward policy network in one compiled call: the PPO pair's rollout (mappo, ippo).

    if fast_acting(obs, net):                                   # no autograd, float32 on the CPU, a plain MLP
        out = mlp_forward(net, obs, norm, with_id, n_agents)    # what net(inputs) gives, (B, A, d_out)

Acting asks a network for a few dozen rows per step (16 envs x 3 agents at JaxMARL's config), and at that size torch's
cost is its dispatch: the input normalization, the agent-id one-hots, three products and their ReLUs are a dozen ops
of a few microseconds each, per network, per step. Here the same pass is one Numba call: the inputs normalized and
clipped as InputNorm does, the one-hot id added as a weight row, each layer one BLAS product, bias and ReLU in one
pass over the output (results/speed/rollout.md times the rollout with it).

The network is the scripts' `Net` without LayerNorm or GRU: `fc`, `mid`, `head`, each a `GroupLinear`
(runtime/layers.py) with weights (n, d_in, d_out) and biases (n, 1, d_out), n = 1 (shared by the agents) or n = A (one
per agent), ReLU after the first two. The update keeps the torch modules (it needs their gradients), so `fast_acting` is
false wherever autograd records. Tensors on another device or of another dtype (--cuda) take the modules too, with a
one-line notice.
tests/test_mlp.py holds the pass equal to the modules.
"""

import warnings

import numba
import numpy as np
import torch
import torch.nn as nn

from runtime.norm import INPUT_CLIP


def fast_acting(x: torch.Tensor, net: nn.Module) -> bool:
    """Whether `mlp_forward` serves `net` on `x`: autograd off, float32 on the CPU, no LayerNorm, no GRU."""
    if torch.is_grad_enabled() or not isinstance(net.norm, nn.Identity) or not hasattr(net.mid, "weight"):
        return False
    if x.device.type != "cpu" or x.dtype != torch.float32:
        warnings.warn(f"acting: {x.dtype} tensors on {x.device.type} run the torch modules", stacklevel=2)
        return False  # once per calling line (Python's default filter)
    return True


def mlp_forward(net: nn.Module, x: torch.Tensor, norm=None, with_id=False, n_agents=None) -> torch.Tensor:
    """`net` on x (B, A, d) normalized by `norm` (an InputNorm, or None) with a one-hot agent id appended if `with_id`.

    x may be one row per env, (B, d): every one of `n_agents` agents sees it (a centralized critic's state).
    """
    x = np.ascontiguousarray((x[:, None] if x.dim() == 2 else x).numpy())
    on = norm is not None and norm.on
    mean, var = (norm.mean.numpy(), norm.var.numpy()) if on else (np.zeros(0, np.float32), np.zeros(0, np.float32))
    out = _forward(x, n_agents or x.shape[1], on, mean, var, with_id, *_layer_views(net))
    return torch.from_numpy(out)


def _layer_views(net):
    """The layers' weights and biases as numpy views of their storage, taken once per network (a dozen nested module
    lookups cost more than the kernel): optimizers and load_state_dict update them in place. A move between devices
    replaces the storage, which the first weight's address tells."""
    address, views = net.__dict__.get("_mlp_views", (None, None))
    if address != net.fc.weight.data_ptr():
        views = [t.detach().numpy() for layer in (net.fc, net.mid, net.head) for t in (layer.weight, layer.bias)]
        address = net.fc.weight.data_ptr()
        net.__dict__["_mlp_views"] = address, views
    return views


@numba.njit(cache=True)
def _dense(x, w, b, relu):  # x @ w + b, ReLU'd in the same pass over the output
    z = np.dot(x, w)
    for i in range(z.shape[0]):
        for j in range(z.shape[1]):
            v = z[i, j] + b[j]
            z[i, j] = v if (v > 0.0 or not relu) else 0.0
    return z


@numba.njit(cache=True)
def _forward(x, n_agents, normalize, mean, var, with_id, w1, b1, w2, b2, w3, b3):
    """(B, X, d), X = A or 1 (a row every agent sees) -> (B, A, d_out). The first layer's product is taken once per
    input row and the one-hot id added as its weight row (a centralized critic's state: once per env, not per agent);
    shared weights (n = 1): one product of every agent's rows, n = A: agent a's rows through its own layers."""
    B, X, d, n, A, H = x.shape[0], x.shape[1], x.shape[2], w1.shape[0], n_agents, w1.shape[2]
    if normalize:  # as InputNorm: (x - mean) / sqrt(var + 1e-8), clipped; the d square roots taken once
        xn, std = np.empty((B, X, d), np.float32), np.sqrt(var + np.float32(1e-8))
        for e in range(B):
            for r in range(X):
                for i in range(d):
                    v = (x[e, r, i] - mean[i]) / std[i]
                    xn[e, r, i] = min(max(v, np.float32(-INPUT_CLIP)), np.float32(INPUT_CLIP))
    else:
        xn = x
    per_set = A if n == 1 else 1  # agents per weight set
    out = np.empty((B, A, w3.shape[2]), np.float32)
    for k in range(n):
        rows = xn.reshape(B * X, d) if n == 1 else np.ascontiguousarray(xn[:, k if X > 1 else 0])
        z = np.dot(rows, np.ascontiguousarray(w1[k, :d]))  # n = 1: row e * X + r; n = A: row e
        h = np.empty((B * per_set, H), np.float32)
        for e in range(B):
            for j in range(per_set):
                a = j if n == 1 else k
                zr, row = z[e * X + (a if X > 1 else 0)] if n == 1 else z[e], h[e * per_set + j]
                for c in range(H):
                    v = zr[c] + b1[k, 0, c]
                    if with_id:
                        v += w1[k, d + a, c]
                    row[c] = v if v > 0.0 else 0.0
        h = _dense(h, w2[k], b2[k, 0], True)
        h = _dense(h, w3[k], b3[k, 0], False)
        for e in range(B):
            for j in range(per_set):
                out[e, j if n == 1 else k] = h[e * per_set + j]
    return out
