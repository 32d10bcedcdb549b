"""Diagnosis screens for issue 23: an on-policy script on simple_reference_v3 with one thing changed.

    python probes/comm_screens.py given-speaker mappo --seed 0 --total-timesteps 1000000 --run-dir runs/x
    python probes/comm_screens.py factored-heads mappo --seed 0 --total-timesteps 1000000 --run-dir runs/y

Each runs algos/<script>.py (mappo or ippo) unchanged but for one thing, in training and in every evaluation:

* `given-speaker`: every symbol an agent sends is replaced by the colour of the target it sees (symbol k for
  landmark k). The policy still chooses its moves, and must learn to read its partner's symbol. If it then reaches
  a communicating team's return (probes/comm_probe.py: about -11), listening is learnable, and what fails without
  this is the speaking (or the two at once).
* `factored-heads`: the MAPPO paper's action heads for this task (MultiDiscrete [5 moves, 10 symbols]): the policy
  over mpe2's Discrete(50) is the product of a move and a symbol distribution, from the first 15 of the head's 50
  outputs (joint logit of a = move + 5 symbol: log pi(move) + log pi(symbol); its entropy is the sum of the two).
  Its checkpoints act through this screen only (comm_probe.py reads the head as a plain Discrete(50)).

Discrete actions only (mpe2's Discrete(50): move = a % 5, symbol = a // 5).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
from torch.distributions import Categorical

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MOVES, COLOUR = 5, slice(8, 11)  # mpe2 simple_reference: the target colour an agent sees sits at obs[8:11]


class GivenSpeaker:
    """A VecEnv whose agents' symbols are the colours they see (the rest of the action is the policy's)."""

    def __init__(self, env):
        self.env, self.last = env, None

    def __getattr__(self, name):
        return getattr(self.env, name)

    def reset(self, *args, **kwargs):
        self.last = self.env.reset(*args, **kwargs)
        return self.last

    def step(self, actions):
        seen = np.argmax(self.last.obs["agent"][..., COLOUR], -1)
        step = self.env.step({**actions, "agent": np.asarray(actions["agent"]) % MOVES + MOVES * seen})
        self.last = step.next
        return step


def factored(out):
    """A product of a move and a symbol distribution over Discrete(50), from the first 15 outputs (..., 50)."""
    move, symbol = out[..., :MOVES].log_softmax(-1), out[..., MOVES : MOVES + 10].log_softmax(-1)
    return Categorical(logits=(symbol.unsqueeze(-1) + move.unsqueeze(-2)).flatten(-2), validate_args=False)


def main(argv: list[str]) -> None:
    screens = ("given-speaker", "factored-heads")
    if len(argv) < 2 or argv[0] not in screens or argv[1] not in ("mappo", "ippo") or "--continuous-actions" in argv:
        sys.exit(f"usage: python probes/comm_screens.py {{{','.join(screens)}}} {{mappo,ippo}} [the script's flags]")
    script = ROOT / "algos" / f"{argv[1]}.py"
    spec = importlib.util.spec_from_file_location(f"_screen_{argv[1]}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if argv[0] == "given-speaker":
        make_env, make_eval_env = module.make_env, module.make_eval_env
        module.make_env = lambda *a, **k: GivenSpeaker(make_env(*a, **k))
        module.make_eval_env = lambda *a, **k: GivenSpeaker(make_eval_env(*a, **k))
    else:
        module.Policy.dist = lambda self, out, avail=None: factored(out)  # simple_reference has no action masks
    sys.argv = [str(script), "--env-id", "simple_reference_v3", *argv[2:]]
    module.cli(module.Args, module.main)


if __name__ == "__main__":
    main(sys.argv[1:])
