"""simple_spread_v3's reference levels at N agents: a scripted controller, standing still and uniform random actions,
each on protocol v2's fixed episodes of the standard env (mpe2), for the study of more agents (issue 46).

    python probes/spread_levels.py              # N = 3, 4, 6: writes results/simple_spread_v3/agents/levels.md, .json
    python probes/spread_levels.py --agents 3,6 --episodes 200 --out /tmp/levels

The scripted controller is a ceiling to measure learners against, not an optimum. Every step, each env's agents are
assigned to the landmarks one to one by the Hungarian method on their distances (scipy's linear_sum_assignment), and
each agent takes the discrete action whose coasting stop lies nearest its landmark. MPE moves an agent by
p' = p + v dt, then v' = 0.75 v + 0.5 u (damping 0.25, sensitivity 5, dt 0.1, mass 1; mpe2/_mpe_utils/core.py), so an
agent that stops pushing coasts sum_k 0.75^k v' dt = 0.4 v' further: the action u is chosen on p + v dt + 0.4 v'(u).
Agents see every position in simple_spread, so the controller uses only what each agent observes (agent 0's view of
the landmarks makes the assignment every agent would make). Collisions are not avoided: the assignment keeps agents
apart except on their way. The `nearest` controller is the same without the assignment (each agent heads for its own
nearest landmark): the gap between the two is what coordination is worth at each N.
"""

import argparse
import functools
import json
import sys
from datetime import date
from pathlib import Path

import numpy as np
from scipy.optimize import linear_sum_assignment

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.host import out_file  # noqa: E402
from runtime.args import MultiAgentArgs, make_eval_env  # noqa: E402  (the checkout's own layer)
from runtime.evaluation import FINAL_EPISODES, FINAL_SEED, evaluate  # noqa: E402

PUSH = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], np.float64)  # mpe2's discrete actions 0-4 as forces
DT, DECAY, GAIN, COAST = 0.1, 0.75, 0.5, 0.4  # dt; velocity kept per step; velocity per unit push; coasting / v'
POLICIES = ("scripted", "nearest", "no-op", "random")


def distances(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(E, N, 6N) simple_spread observations -> the landmarks' absolute positions (E, N, 2), from agent 0's view, and
    the distances (E, agents, landmarks)."""
    E, N, _ = obs.shape
    pos = obs[..., 2:4]
    landmarks = pos[:, :1] + obs[:, :1, 4 : 4 + 2 * N].reshape(E, N, 2)
    return landmarks, np.linalg.norm(pos[:, :, None] - landmarks[:, None], axis=-1)


def scripted_actions(obs: np.ndarray, assign: bool = True) -> np.ndarray:
    """(E, N, 6N) simple_spread observations -> (E, N) discrete actions of the scripted controller.

    assign=False is the controller without coordination: each agent heads for its own nearest landmark.
    """
    vel, pos = obs[..., 0:2], obs[..., 2:4]
    landmarks, dist = distances(obs)  # (E, N, 2), (E, agents, landmarks)
    if assign:
        goals = np.stack([linear_sum_assignment(d)[1] for d in dist])  # rows come back in agent order
    else:
        goals = dist.argmin(-1)
    target = np.take_along_axis(landmarks, goals[..., None], axis=1)  # (E, N, 2): each agent's landmark
    v = vel[:, :, None]
    stops = pos[:, :, None] + v * DT + COAST * (DECAY * v + GAIN * PUSH)  # (E, N, 5 candidate pushes, 2)
    return np.linalg.norm(stops - target[:, :, None], axis=-1).argmin(-1)


def policy(name: str, group: str):
    """make(num_envs, rng) -> act(obs, done) -> {group: actions}, the shape runtime.evaluation plays."""

    def make(num_envs, rng):
        def act(obs, done):
            o = obs.obs[group]
            if name in ("scripted", "nearest"):
                return {group: scripted_actions(o, assign=name == "scripted")}
            if name == "no-op":
                return {group: np.zeros(o.shape[:2], np.int64)}
            return {group: rng.integers(0, 5, o.shape[:2])}

        return act

    return make


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="3,4,6", help="comma-separated N")
    parser.add_argument("--episodes", type=int, default=FINAL_EPISODES, help="of protocol v2's fixed set (first K)")
    stem = str(ROOT / "results" / "simple_spread_v3" / "agents" / "levels")
    parser.add_argument("--out", type=out_file, default=stem, help="without suffix")
    args = parser.parse_args(argv)
    try:
        counts = [int(n) for n in args.agents.split(",")]
    except ValueError:
        parser.error(f"--agents {args.agents!r}: expected comma-separated integers, e.g. 3,4,6")
    if min(counts) < 1 or args.episodes < 1:
        parser.error("--agents must be >= 1 each and --episodes >= 1")
    rows = []
    for n in counts:
        run_args = MultiAgentArgs(env_id="simple_spread_v3", env_kwargs=json.dumps({"N": n}))
        make_env = functools.partial(make_eval_env, run_args)  # (num_envs, seed) -> the standard env
        probe = make_env(1, 0)
        group = next(iter(probe.groups))
        probe.close()
        row = {"N": n}
        for name in POLICIES:
            returns, _ = evaluate(make_env, policy(name, group), args.episodes, FINAL_SEED)
            row[name] = {"mean": float(returns.mean()), "std": float(returns.std()), "episodes": len(returns)}
            print(f"N={n} {name}: {returns.mean():.2f} ± {returns.std():.2f}", flush=True)
        rows.append(row)
    command = " ".join(["python probes/spread_levels.py", *(argv if argv is not None else sys.argv[1:])])
    report = {"date": date.today().isoformat(), "command": command, "env_id": "simple_spread_v3",
              "protocol": "v2", "seed": FINAL_SEED, "rows": rows}  # fmt: skip
    lines = [
        "# simple_spread_v3 at N agents: the scripted, nearest-landmark, standing-still and random levels",
        "",
        f"`{command}` ({report['date']}): each policy on the first {args.episodes} episodes of protocol v2's fixed "
        f"set (env i seeded {FINAL_SEED} + i) of mpe2's simple_spread_v3 with `--env-kwargs '{{\"N\": n}}'`; the "
        "return is the mean over agents of each agent's summed reward, as every row of results/ reports it "
        "(mean ± std over episodes). The scripted controller is this probe's docstring.",
        "",
        "| N | scripted | nearest landmark (no assignment) | no-op (stand still) | random |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cells = [f"{r[k]['mean']:.2f} ± {r[k]['std']:.2f}" for k in POLICIES]
        lines.append(f"| {r['N']} | " + " | ".join(cells) + " |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
