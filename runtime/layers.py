"""The scripts' stacked layer: n linear layers (one per agent, or per copy of a network) in one batched product.

    layer = layer_init(GroupLinear(n, d_in, d_out))     # the script's own initialization draws the weights
    y = layer(x)                                        # x (n, R, d_in) -> (n, R, d_out): stack k through layer k
    y = per_agent(layer, x)                             # x (B, A, d_in) rows -> (B, A, d_out), agent a's layer a

A group's agents each have their own network (or share one), and a few dozen rows per agent make torch's dispatch the
cost of a small product: one `torch.baddbmm` over the weights (n, d_in, d_out) and biases (n, 1, d_out) serves them
all, product and bias in one op. The layer's other parts read this layout: runtime/mlp.py's compiled acting pass,
runtime/gru.py's recurrence (w_hh, b_hh), optim.py's per-agent clipping (each agent's slice of the first dimension).

How a network's rows form the stacks is its script's: the DDPG family stacks agents and twin critics first, (A, B, d);
the PPO pair's networks run on (B, A, d) rows, one stack of every agent's rows (n = 1, shared) or agent a's rows in
stack a (`per_agent`, as mappo.py and ippo.py call it). The weights start at zero until the script's `layer_init`
draws them: nn.Linear's default in the DDPG family, orthogonal in the PPO pair (its --ortho-init).
"""

import torch
import torch.nn as nn


class GroupLinear(nn.Module):
    """n independent linear layers in one batched product, layer k on stack k: (n, R, d_in) -> (n, R, d_out). x may
    hold the first m < n stacks only (matd3's actor loss: the first of its twin critics)."""

    def __init__(self, n: int, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n, d_in, d_out))  # drawn by the script's layer_init
        self.bias = nn.Parameter(torch.zeros(n, 1, d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(x) == len(self.weight):
            return torch.baddbmm(self.bias, x, self.weight)
        return torch.baddbmm(self.bias[: len(x)], x, self.weight[: len(x)])


def per_agent(layer: GroupLinear, x: torch.Tensor) -> torch.Tensor:
    """A GroupLinear on (B, A, d_in) rows -> (B, A, d_out): n = 1 puts every agent of every env in the one stack
    (shared), else agent a's rows go through stack a (its own layer); product and bias in one op either way."""
    if len(layer.weight) == 1:
        return layer(x.reshape(1, -1, x.shape[-1])).view(*x.shape[:-1], -1)
    return layer(x.transpose(0, 1)).transpose(0, 1)
