"""Why does EPyMARL's own QMIX learn Foraging-8x8-2p-2f-coop in 2M steps (0.69 and 0.55, team, on our protocol) where
qmix.py at its defaults ends near 0 (issue 42)? EPyMARL's `qmix.yaml` differs from our defaults in settings qmix.py
has flags for (discount, gradient steps, schedules) and in two it had none for: `standardise_rewards: True`, now
qmix.py's --standardise-rewards (the team rewards replayed as (r - mean) / std of their running statistics), and
`use_rnn: False`. This probe is qmix.py with, switched on by its own flags (every qmix.py flag still applies):

* `--centre-rewards` and `--scale-rewards`: the standardisation's two halves apart, r - mean and r / std. On a sparse
  task the mean is a small positive number, so centring makes every step without food cost a little (a step penalty
  that makes the untried actions, still valued near 0, look better: an exploration drive), and scaling makes a
  collection (about 0.25 of team reward) worth several units: which of the two carries it?
* `--feed-forward` (EPyMARL's `use_rnn: False`, its rnn_agent.py): the agent's GRU replaced by a Linear-ReLU layer of
  the same width, so Q reads the current observation only (Linear-ReLU, Linear-ReLU, Linear).

    python probes/qmix_epymarl_gap.py --scale-rewards --env-id Foraging-8x8-2p-2f-coop --total-timesteps 2000000 \
        --eval-episodes 100 --eval-interval 50000 --seed 0 --run-dir /tmp/gap/scale

The probe writes what it switched on to <run dir>/probe.json (give --run-dir). It patches qmix.py in memory only;
the checkpoints it writes are for this probe, not for qmix.py's `--eval-checkpoint` (the layer is not qmix.py's).
"""

import json
import sys
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "algos"))

import qmix  # noqa: E402  (the checkout's own script)

from runtime import RunningNorm, cli  # noqa: E402

PLAIN_TD_TARGETS = qmix.td_targets
PROBE_FLAGS = ("--centre-rewards", "--scale-rewards", "--feed-forward")
REWARDS = RunningNorm()  # as qmix.py's --standardise-rewards: runtime.standardised_rewards
CENTRE, SCALE = True, False  # --centre-rewards; --scale-rewards: False, True


def half_standardised_td_targets(batch, next_values, args):
    """qmix.td_targets on the batch's team rewards only centred (r - mean) or only scaled (r / std) by the running
    statistics, which the batch's own stored steps (its loss mask) update first, as with --standardise-rewards."""
    rewards = batch["reward"]
    REWARDS.update(torch.as_tensor(rewards[batch["loss_mask"]]))
    mean, std = REWARDS.mean.item(), (REWARDS.var + 1e-8).sqrt().item()
    scaled = ((rewards - mean * CENTRE) / (std if SCALE else 1.0)).astype(rewards.dtype)
    return PLAIN_TD_TARGETS(dict(batch, reward=scaled), next_values, args)


class FeedForwardQ(nn.Module):
    """qmix.RecurrentQ's interface without its memory: Linear-ReLU, Linear-ReLU, a linear Q head (EPyMARL's agent
    with use_rnn False); the hidden state passes through untouched (zeros), so every caller works unchanged."""

    def __init__(self, d_in, n_actions, hidden_size):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, hidden_size), nn.ReLU())
        self.layer = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.ReLU())
        self.head = nn.Linear(hidden_size, n_actions)
        self.hidden_size = hidden_size

    def forward(self, x, h=None):  # x (T, B, d_in), h (1, B, H) -> Q (T, B, n_actions), h
        h = x.new_zeros(1, x.shape[1], self.hidden_size) if h is None else h
        return self.head(self.layer(self.encoder(x))), h


def switches(argv: list[str]) -> tuple[dict, list[str]]:
    """This probe's flags (on or off) and the rest of the command line, for qmix.py."""
    return {f: f in argv for f in PROBE_FLAGS}, [a for a in argv if a not in PROBE_FLAGS]


if __name__ == "__main__":
    probe, rest = switches(sys.argv[1:])
    run_dirs = [rest[i + 1] for i, a in enumerate(rest[:-1]) if a in ("--run-dir", "--run_dir")]
    if not run_dirs:
        sys.exit("error: give --run-dir DIR: the probe writes what it switched on to DIR/probe.json beside the run")
    halves = probe["--centre-rewards"], probe["--scale-rewards"]
    if all(halves) or (any(halves) and "--standardise-rewards" in rest):
        sys.exit("error: give one of --centre-rewards and --scale-rewards, without --standardise-rewards (both halves "
                 "together are qmix.py's --standardise-rewards)")  # fmt: skip
    if any(halves):
        CENTRE, SCALE = halves
        qmix.td_targets = half_standardised_td_targets
    if probe["--feed-forward"]:
        qmix.RecurrentQ = FeedForwardQ
    Path(run_dirs[-1]).mkdir(parents=True, exist_ok=True)
    Path(run_dirs[-1], "probe.json").write_text(json.dumps(probe) + "\n")
    sys.argv = [sys.argv[0], *rest]
    print("probe:", ", ".join(f"{f} {'on' if on else 'off'}" for f, on in probe.items()))
    cli(qmix.Args, qmix.main)
