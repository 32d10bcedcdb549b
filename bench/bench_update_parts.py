"""The PPO pair's fast parts against their plain forms, one at a time, on this CPU, one torch thread.

    python bench/bench_update_parts.py       # writes results/speed/update_parts.md and update_parts.json

Each part of mappo.py's and ippo.py's update and acting that has a fast form in the run-time layer or the script,
timed against the plain form it replaced (the one tests/test_mappo.py holds it equal to), at two shapes: a minibatch
of JaxMARL's matched config (512 env steps x 3 agents: results/speed/jaxmarl.md) and one of our defaults (3,200 x 3),
or acting's 16 or 128 envs x 3 agents. Forms alternate round by round; each cell is the median of the rounds' best.

* categorical: log-probs and entropy of 5 actions, forward and backward (runtime.Categorical: log-softmax along the
  first axis; torch.distributions.Categorical);
* sampling: an action and its log-prob per agent, no gradient (Gumbel-max; torch's multinomial path);
* layer: one 64 -> 64 layer of a shared network, forward and backward (one baddbmm; product, then bias add);
* clip: the actor's and the critic's gradients clipped to norm 0.5 (runtime.clip_grad_norm: foreach;
  nn.utils.clip_grad_norm_);
* adam: one step over a 64-wide actor and critic (fused; torch's per-tensor loop on the CPU);
* acting mode: a 64-wide actor's forward, sampling and log-probs at acting's rows (`torch.inference_mode()`;
  `torch.no_grad()`).
"""

import argparse
import json
import platform
import statistics
import timeit
from datetime import date
from pathlib import Path

import torch
import torch.nn as nn
from host import cpu_name, positive

from runtime import Categorical, clip_grad_norm

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "speed"


def torch_categorical(logits):
    return torch.distributions.Categorical(logits=logits, validate_args=False)


def cases(rows):
    """name -> (fast, plain) callables at `rows` agent-steps."""
    torch.manual_seed(0)
    logits = torch.randn(rows // 3, 3, 5, requires_grad=True)
    actions = torch.randint(0, 5, (rows // 3, 3))

    def dist_loss(make):
        def f():
            d = make(logits)
            (d.log_prob(actions).sum() + d.entropy().sum()).backward()

        return f

    def sampling(make):
        small = logits.detach()[:16] if rows < 9600 else logits.detach()[:128]

        def f():
            d = make(small)
            d.log_prob(d.sample())

        return f

    x = torch.randn(1, rows, 64)
    w, b = torch.randn(1, 64, 64, requires_grad=True), torch.zeros(1, 1, 64, requires_grad=True)
    layer_fast = lambda: torch.baddbmm(b, x, w).sum().backward()  # noqa: E731
    layer_plain = lambda: (x[0] @ w[0] + b[0]).sum().backward()  # noqa: E731

    def nets():
        shapes = [(1, 21, 64), (1, 1, 64), (1, 64, 64), (1, 1, 64), (1, 64, 5), (1, 1, 5)]
        actor = [torch.randn(s, requires_grad=True) for s in shapes]
        critic = [torch.randn(s[:-1] + (1,) if i >= 4 else s, requires_grad=True) for i, s in enumerate(shapes)]
        for p in actor + critic:
            p.grad = torch.randn_like(p)
        return actor, critic

    actor, critic = nets()
    clip_fast = lambda: (clip_grad_norm(actor, 0.5), clip_grad_norm(critic, 0.5))  # noqa: E731
    clip_plain = lambda: (nn.utils.clip_grad_norm_(actor, 0.5), nn.utils.clip_grad_norm_(critic, 0.5))  # noqa: E731
    adams = [torch.optim.Adam(actor + critic, lr=1e-4, eps=1e-5, **kw) for kw in ({"fused": True}, {"foreach": False})]
    obs = torch.randn(16 if rows < 9600 else 128, 3, 21)

    def acting(mode):
        def f():
            with mode():
                h = torch.relu(torch.baddbmm(actor[1], obs.reshape(1, -1, 21), actor[0]))
                h = torch.relu(torch.baddbmm(actor[3], h, actor[2]))
                d = Categorical(torch.baddbmm(actor[5], h, actor[4]))
                d.log_prob(d.sample()).numpy()

        return f

    return {
        "categorical": (dist_loss(Categorical), dist_loss(torch_categorical)),
        "sampling": (sampling(Categorical), sampling(torch_categorical)),
        "layer": (layer_fast, layer_plain),
        "clip": (clip_fast, clip_plain),
        "adam": (adams[0].step, adams[1].step),
        "acting mode": (acting(torch.inference_mode), acting(torch.no_grad)),
    }


def measure(rows, rounds, number):
    fns = cases(rows)
    out = {}
    for name, (fast, plain) in fns.items():
        times = {"fast": [], "plain": []}
        for _ in range(rounds):  # alternate the forms: the machine's load moves both alike
            for form, f in (("fast", fast), ("plain", plain)):
                f()
                times[form].append(min(timeit.repeat(f, number=number, repeat=3)) / number * 1e6)
        out[name] = {form: statistics.median(t) for form, t in times.items()}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=positive(int), default=5)
    ap.add_argument("--number", type=positive(int), default=50, help="calls per timing")
    args = ap.parse_args()
    torch.set_num_threads(1)
    shapes = {"matched (512 x 3 rows; acting 16 x 3)": 1536, "defaults (3,200 x 3 rows; acting 128 x 3)": 9600}
    report = {"date": date.today().isoformat(), "cpu": cpu_name(), "torch": torch.__version__,
              "python": platform.python_version(), "threads": 1,
              "results": {name: measure(rows, args.rounds, args.number) for name, rows in shapes.items()}}  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "update_parts.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# The PPO pair's fast parts against their plain forms (microseconds per call, one thread)",
        "",
        f"Measured {report['date']} on {report['cpu']}, torch {report['torch']}. Regenerate: "
        "`python bench/bench_update_parts.py` (what each part is: its docstring). Median over "
        f"{args.rounds} alternating rounds of the best of 3 timings of {args.number} calls.",
        "",
        "| part | shape | fast (us) | plain (us) | plain / fast |",
        "|---|---|---:|---:|---:|",
    ]
    for shape, parts in report["results"].items():
        for name, t in parts.items():
            lines.append(f"| {name} | {shape} | {t['fast']:,.1f} | {t['plain']:,.1f} | {t['plain'] / t['fast']:.2f}x |")
    (OUT / "update_parts.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
