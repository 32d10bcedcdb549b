"""Running mean and variance, merged batch by batch: value targets, network inputs and replayed rewards normalized on
the fly."""

import numpy as np
import torch
import torch.nn as nn


class RunningNorm(nn.Module):
    """Running mean/std over samples of shape `shape` (Chan et al.'s parallel merge of each batch's moments).

    Its moments are buffers, so a checkpoint reloads with the statistics its networks acted on. mappo.py and
    ippo.py normalize value targets with it (the critic predicts values in these units); InputNorm below is the
    networks' inputs (--feature-norm running of mappo.py, ippo.py and vdac.py).
    """

    def __init__(self, shape=()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.tensor(1e-4))  # the prior (mean 0, var 1) weighs almost nothing

    def update(self, x):  # x (..., *shape): every leading index is one sample
        x = x.reshape(-1, *self.mean.shape).to(self.mean)
        batch_mean, batch_var, n = x.mean(0), x.var(0, unbiased=False), len(x)
        delta, total = batch_mean - self.mean, self.count + n
        self.mean += delta * n / total
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.count = total

    def normalize(self, x, clip=None):  # clip: normalized inputs are clipped to [-clip, clip]
        z = (x - self.mean) / torch.sqrt(self.var + 1e-8)
        return z if clip is None else z.clamp(-clip, clip)

    def denormalize(self, x):
        return x * torch.sqrt(self.var + 1e-8) + self.mean


def standardised_rewards(norm: RunningNorm, rewards: np.ndarray, stored: np.ndarray) -> np.ndarray:
    """A replayed batch's rewards as (r - mean) / std of every stored reward replayed so far (--standardise-rewards
    of iql.py, vdn.py, qmix.py, wqmix.py, qtran.py and dcg.py; EPyMARL's `standardise_rewards`): the batch's own
    stored steps (`stored`, a mask of `rewards`' shape: not padding, not a dead agent's) update `norm` first. The same
    shape and dtype as `rewards`.

    On a sparse task this makes a rare reward worth several units (on Foraging-8x8-2p-2f-coop a food, about 0.25 of
    team reward, is 5-7 standard deviations; with it the three scripts solve the task, and for qmix.py the scale alone,
    not the centring, does it: results/Foraging-8x8-2p-2f-coop/reward_scale.md).
    """
    norm.update(torch.as_tensor(rewards[stored]))
    return ((rewards - norm.mean.item()) / torch.sqrt(norm.var + 1e-8).item()).astype(rewards.dtype)


INPUT_CLIP = 10.0  # --feature-norm running: normalized inputs are clipped to [-10, 10]


class InputNorm(RunningNorm):
    """A network's inputs normalized per feature by running mean/std, clipped to +-INPUT_CLIP (--feature-norm running).

    Off, it is the identity and holds no buffers: a checkpoint's state dict is what it was without it. The scripts
    call `update` once per rollout, after the update, so acting and the next update see the same statistics.
    """

    def __init__(self, dim, on=True):
        if on:
            super().__init__(dim)
        else:
            nn.Module.__init__(self)
        self.on = on

    def forward(self, x):
        return self.normalize(x, INPUT_CLIP) if self.on else x

    def update(self, x, alive=None):  # x (..., dim) a rollout's inputs; alive (...): the samples to count, if given
        if self.on:
            x = torch.as_tensor(x)
            super().update(x if alive is None else x[torch.as_tensor(alive)])  # RunningNorm moves it to its device


# --feature-norm's values when it was a bool: checkpoints and results from before the running normalization hold them
FEATURE_NORM_BEFORE = {True: "layer", False: "none"}


def feature_norm(args) -> str:
    """The input normalization of mappo.py/ippo.py: "running", "layer" or "none" (a bool of an older run read as
    what it meant: True the paper's input LayerNorm, False none)."""
    return FEATURE_NORM_BEFORE.get(args.feature_norm, args.feature_norm)
