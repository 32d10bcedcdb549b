"""Does QTRAN's joint value know better than its agents? A probe of qtran.py checkpoints (issue 43).

    python probes/qtran_probe.py results/runs/simple_spread_v3/qtran-3m/seed{0,1,2}/last.pt [--episodes 1000]

QTRAN learns two things: a joint action-value Q_jt(s, u) on the team's TD target, and the agents' utilities Q_a,
which act. The two are tied only by L_opt (at the agents' greedy joint action u*, sum_a max Q_a = Q_jt(s, u*) - V(s))
and L_nopt (at the joint actions taken, sum_a Q_a(u_a) at or above Q_jt - V): when both are zero, u* is Q_jt's
argmax (Son et al. 2019, Theorem 1). A run that fails can fail in either part: Q_jt has not learned which joint
actions are good, or the agents have not learned what Q_jt knows. The probe plays protocol v2's final-evaluation
episodes (mpe2, env i seeded 10000 + i) twice per checkpoint:

* `agents`: every agent greedy on its own utility, as the run's evaluation: its return is the seed's final policy.
* `joint`: the team acting by Q_jt. From u*, each agent in turn moves to the action that maximises Q_jt(s, u_i,
  u_-i) with the others held, until no agent moves (coordinate ascent, a local maximum of Q_jt over joint actions;
  centralised: Q_jt reads the state and every agent's features). For `--variant alt` agent i moves by its own
  counterfactual head Q_jt(s, ., u_-i), and Q_jt(s, u) is the mean of the agents' heads (qtran.joint_value), so
  there the ascent ends at a joint action no agent's own head would leave, which need not raise that mean.

On the episodes' steps it also reports `moved`, the share of steps where the ascent leaves u*; `gain`, how far
Q_jt rises along it; `spread`, how far one agent's action moves Q_jt with the others at u* (max minus min over its
actions, the mean over agents and steps); and `opt_gap`, L_opt's error |sum_a max Q_a - Q_jt(s, u*) + V(s)|. If
`joint` returns much more than `agents`, Q_jt knows what the agents do not and the transfer is what fails; if both
are as poor, Q_jt itself is. One JSON line per checkpoint and policy goes to stdout; --out writes the list.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "algos"))
import qtran  # noqa: E402

from bench.host import out_file  # noqa: E402
from buffers import float_tensor  # noqa: E402
from envs import make  # noqa: E402
from runtime import checkpoint_args  # noqa: E402
from runtime.checkpoint import CheckpointError, read_checkpoint  # noqa: E402
from runtime.evaluation import FINAL_SEED  # noqa: E402


def load(path):
    """The QTRAN team of a qtran.py checkpoint, its groups and its env id."""
    try:
        ckpt = read_checkpoint(path)
    except CheckpointError as e:
        raise SystemExit(str(e)) from None
    if ckpt.get("algo") != qtran.ALGO:
        raise SystemExit(f"{path}: a {ckpt.get('algo')} checkpoint; this probe reads qtran.py's (its joint Q_jt)")
    args = checkpoint_args(qtran.Args, ckpt["args"])
    env = make(args.env_id, num_envs=1, seed=0, backend="numba")
    specs, state_dim = dict(env.groups), int(np.prod(env.state_shape))
    env.close()
    net = qtran.QTRAN(specs, state_dim, args)
    net.load_state_dict(ckpt["nets"]["qtran"])
    return net.eval(), specs, args


class Team:
    """One step's view of the team: utilities, GRU features and valid actions over all agents (groups concatenated,
    actions padded to the largest group's count, as qtran.group_outputs), and Q_jt at any joint action."""

    def __init__(self, net, specs, alt):
        self.net, self.specs, self.alt = net, specs, alt
        self.n = max(spec.action_dim for spec in specs.values())  # the padded action count, as group_outputs'

    def observe(self, obs, hidden):  # -> utilities (E, N, n); keeps features (E, N, H), alive, valid (E, N, n), state
        mb = {f"obs_{g}": float_tensor(obs.obs[g], "cpu")[None] for g in self.specs}  # one step: (1, E, A, ...)
        mb |= {f"agent_mask_{g}": torch.tensor(m, dtype=torch.float32)[None] for g, m in obs.agent_mask.items()}
        mb |= {f"avail_{g}": torch.tensor(a)[None] for g, a in obs.avail_actions.items() if a is not None}
        q, features, alive, valid = (x[0] for x in qtran.group_outputs(self.net.agents, mb, hidden))
        self.q, self.features, self.alive, self.valid = q.masked_fill(~valid, -torch.inf), features, alive, valid
        self.state = torch.tensor(obs.state)
        return self.q

    def value(self, u):  # Q_jt(s, u) and V(s) for joint actions u (E, N)
        out, v = self.net.joint(self.features, F.one_hot(u, self.n).float(), self.alive, self.state)
        return (qtran.joint_value(out, u, self.alive) if self.alt else out), v

    def deviations(self, u, i):  # Q_jt(s, a, u_-i) for every action a of agent i, the others held: (E, n)
        if self.alt:  # the counterfactual network's own head for agent i
            out, _ = self.net.joint(self.features, F.one_hot(u, self.n).float(), self.alive, self.state)
            q = out[:, i]
        else:  # n joint actions per env, as a (E, n) batch
            cand = u[:, None, :].repeat(1, self.n, 1)
            cand[:, :, i] = torch.arange(self.n)
            E, N = u.shape
            features, alive = self.features[:, None].expand(E, self.n, N, -1), self.alive[:, None].expand(E, self.n, N)
            onehot, state = F.one_hot(cand, self.n).float(), self.state[:, None].expand(E, self.n, -1)
            q, _ = self.net.joint(features, onehot, alive, state)
        return q.masked_fill(~self.valid[:, i], -torch.inf)

    def ascend(self, u, sweeps=50):
        """Coordinate ascent on Q_jt from u: each agent in turn to its best action with the others held, until no
        agent's move raises Q_jt (each move raises it, so this ends; `sweeps` bounds it)."""
        u = u.clone()
        for _ in range(sweeps):
            moved = False
            for i in range(u.shape[1]):
                d = self.deviations(u, i)
                better = d.max(-1).values > d.gather(-1, u[:, i : i + 1])[:, 0] + 1e-6
                u[:, i] = torch.where(better, d.argmax(-1), u[:, i])
                moved |= bool(better.any())
            if not moved:
                break
        return u


@torch.no_grad()
def play(net, specs, args, episodes, by_joint):
    """Protocol v2's final-evaluation episodes with the agents greedy (or the team acting by Q_jt): the mean return
    over agents, and on each step the ascent's departure from u* and L_opt's error."""
    env = make(args.env_id, num_envs=episodes, seed=FINAL_SEED, backend="pettingzoo", vector="sync")
    team = Team(net, specs, args.variant == "alt")
    hidden = {g: torch.zeros(1, episodes, spec.n_agents, args.hidden_size) for g, spec in specs.items()}
    obs, ret, moved, gain, spread, opt_gap = env.reset(), np.zeros(episodes), [], [], [], []
    while True:
        best, greedy = team.observe(obs, hidden).max(-1)
        joint = team.ascend(greedy)
        q_greedy, v = team.value(greedy)
        moved.append((joint != greedy).any(-1).float().mean().item())
        gain.append((team.value(joint)[0] - q_greedy).mean().item())
        for i in range(greedy.shape[1]):  # how much one agent's action moves Q_jt, the others at u*
            d = team.deviations(greedy, i)
            spread.append((d.max(-1).values - d.masked_fill(d == -torch.inf, torch.inf).min(-1).values).mean().item())
        opt_gap.append((torch.where(team.alive > 0, best, 0.0).sum(-1) - q_greedy + v).abs().mean().item())
        u, start = (joint if by_joint else greedy).numpy(), 0
        actions = {}
        for g, spec in specs.items():
            actions[g], start = u[:, start : start + spec.n_agents], start + spec.n_agents
        step = env.step(actions)
        ret += np.concatenate([step.rewards[g] for g in env.groups], -1).mean(-1)
        if step.done.all():
            break
        obs = step.next
    env.close()
    stats = {k: float(np.mean(v)) for k, v in dict(moved=moved, gain=gain, spread=spread, opt_gap=opt_gap).items()}
    return {"return": float(ret.mean()), **stats, "episodes": episodes}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", help="qtran.py checkpoints (last.pt)")
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--out", type=out_file, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for path in args.checkpoints:
        net, specs, run_args = load(path)
        for policy in ("agents", "joint"):
            row = {"checkpoint": path, "env_id": run_args.env_id, "policy": policy}
            row |= play(net, specs, run_args, args.episodes, by_joint=policy == "joint")
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
