"""A diagnosis screen for issue 23: an on-policy script on simple_reference_v3 with the speaking done for it.

    python results/given_speaker.py mappo --seed 0 --total-timesteps 1000000 --run-dir runs/given_speaker

Runs algos/<script>.py unchanged, except that every symbol an agent sends is replaced by the colour of the target
it sees (symbol k for landmark k), in training and in every evaluation. The policy still chooses its moves, and
must learn to read its partner's symbol. If it then reaches a communicating team's return (results/comm_probe.py:
about -11), listening is learnable and what fails without this wrapper is the speaking (or the two at once).
Discrete actions only (mpe2's Discrete(50): move = a % 5, symbol = a // 5).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

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


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in ("mappo", "ippo") or "--continuous-actions" in argv:
        sys.exit("usage: python results/given_speaker.py {mappo,ippo} [discrete-action flags of the script]")
    script = ROOT / "algos" / f"{argv[0]}.py"
    spec = importlib.util.spec_from_file_location(f"_given_{argv[0]}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    make_env, make_eval_env = module.make_env, module.make_eval_env
    module.make_env = lambda *a, **k: GivenSpeaker(make_env(*a, **k))
    module.make_eval_env = lambda *a, **k: GivenSpeaker(make_eval_env(*a, **k))
    sys.argv = [str(script), "--env-id", "simple_reference_v3", *argv[1:]]
    module.cli(module.Args, module.main)


if __name__ == "__main__":
    main(sys.argv[1:])
