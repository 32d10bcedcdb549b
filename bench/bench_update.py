"""The update's floor: the highest env-steps/s each script's update allows on this CPU at the results' settings.

    python bench/bench_update.py            # writes results/speed/update.md and update.json

The PPO update is most of a MAPPO or IPPO run on the Numba MPE (results/speed/train.md). This fills one rollout
of simple_spread_v3 with the script's own networks at its defaults (128 envs x 25 steps x 3 agents, 10 epochs of
one minibatch), then, for one update:

* counts its matrix products with torch's profiler (shapes and FLOPs: 2mkn per product);
* times those products alone, at their shapes, on contiguous operands (best of several rounds);
* times the whole update (median of several).

No rewrite of the update can go below the time of its products without doing fewer FLOPs, so
`env steps per update / products' time` is a ceiling on env-steps/s at these settings on this machine, before
acting, env stepping, elementwise ops or Adam. Both thread counts are measured: 1 (the scripts' default) and 2.

The DDPG family (MADDPG, MATD3, IDDPG) is measured the same way on a replay buffer of `--learning-starts` uniformly
random transitions, one update being one sampled batch of `--batch-size` (sampling and the copy to torch included in
the whole update), at each `--train-frequency` x `--batch-size` of `--ddpg-settings` (env steps per update x
transitions per update). MATD3's actors and targets learn every `--policy-frequency` updates, so its unit is that
many updates.
"""

import argparse
import copy
import importlib.util
import itertools
import json
import os
import platform
import statistics
import time
from datetime import date
from pathlib import Path

import numpy as np
import torch
from host import cpu_name, out_folder
from torch.profiler import ProfilerActivity, profile

import envs
from buffers import ReplayBuffer, RolloutBuffer, float_tensor, joint_fields, joint_transition, to_torch
from runtime import keep_freed_memory

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "speed"
ENV_ID = "simple_spread_v3"
keep_freed_memory()  # as every script's setup() does
PPO, DDPG = ["mappo", "ippo"], ["maddpg", "matd3", "iddpg"]


def load_script(algo):
    """algos/<algo>.py as a module (its main() is not run)."""
    spec = importlib.util.spec_from_file_location(algo, ROOT / "algos" / f"{algo}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# JaxMARL's IPPO config (results/speed/jaxmarl.md: the `ippo` pair), the row `ippo (JaxMARL's config)`
MATCHED = dict(num_envs=16, num_steps=128, update_epochs=4, num_minibatches=4, hidden_size=64, gamma=0.99,
               feature_norm="none", value_norm=False, huber_delta=0.0, vf_coef=0.5, max_grad_norm=0.5,
               learning_rate=2.5e-4)  # fmt: skip


def filled_rollout(algo, m, seed=0, **flags):
    """The script's policy at its defaults (but `flags`) and one full rollout of it acting on the Numba MPE (targets
    computed), with the script's own optimizer."""
    args = m.Args(**flags)
    env = envs.make(ENV_ID, args.num_envs, seed, backend="numba")
    (g,) = env.groups
    spec = env.groups[g]
    if algo == "mappo":  # centralized critic on the global state
        pol = m.Policy(spec, int(np.prod(env.state_shape)), args)
        rb = RolloutBuffer(args.num_steps, args.num_envs, m.rollout_fields(spec, env.state_shape, args))
        critic_input = lambda o: float_tensor(o.state, "cpu")  # noqa: E731
    else:  # IPPO: each agent's critic on its own observation
        pol = m.Policy(spec, args)
        rb = RolloutBuffer(args.num_steps, args.num_envs, m.rollout_fields(spec, args))
        critic_input = lambda o: float_tensor(o.obs[g], "cpu")  # noqa: E731
    rng, obs = np.random.default_rng(seed), env.reset()
    hidden = m.initial_hidden({g: pol}, args, args.num_envs, "cpu")
    with torch.no_grad():
        for _ in range(args.num_steps):
            actions, taken = m.act({g: pol}, obs, "cpu", hidden)
            values = pol.value(critic_input(obs))[0]
            step = env.step(actions)
            row = dict(obs=obs.obs[g], state=obs.state, **taken[g], values=values, rewards=step.rewards[g],
                       terminated=step.terminated[g], truncated=step.truncated, final_values=values,
                       agent_mask=obs.agent_mask[g])  # fmt: skip
            rb.add(**{k: v for k, v in row.items() if k in rb.schema})
            obs = step.next
        rb.compute_gae(pol.value(critic_input(obs))[0], args.gamma, args.gae_lambda)
    env.close()
    return args, pol, m.adam(pol.parameters(), args.learning_rate, eps=1e-5), rb, rng


def filled_replay(algo, m, train_frequency, batch_size=256, seed=0):
    """The script's networks, optimizers and replay buffer at its defaults (but these two), the buffer holding
    --learning-starts uniformly random transitions of the Numba MPE, as in main(); returns a one-update callable
    (it returns the last `update()`'s losses; its `nets` attribute: the script's networks)."""
    args = m.Args(train_frequency=train_frequency, batch_size=batch_size)
    torch.manual_seed(seed)
    env = envs.make(ENV_ID, args.num_envs, seed, backend="numba", continuous_actions=args.continuous_actions)
    learners, groups = list(env.groups), env.groups
    actors = torch.nn.ModuleDict({g: m.Actor(spec, args) for g, spec in groups.items()})
    if algo == "iddpg":  # each agent's critic on its own observation and action
        dims = {g: int(np.prod(s.obs_shape)) + s.action_dim for g, s in groups.items()}
    else:  # centralized critics on every observation and every action
        obs_dim = sum(s.n_agents * int(np.prod(s.obs_shape)) for s in groups.values())
        dims = dict.fromkeys(groups, obs_dim + sum(s.n_agents * s.action_dim for s in groups.values()))
    critics = torch.nn.ModuleDict({g: m.Critic(groups[g], dims[g], args) for g in learners})
    fields = joint_fields(groups)  # the state is no field at the defaults (--critic-state off)
    nets = dict(actors=actors, critics=critics, actor_targets=copy.deepcopy(actors),
                critic_targets=copy.deepcopy(critics))  # fmt: skip
    optimizers = dict(actor=torch.optim.Adam(actors.parameters(), lr=args.actor_lr, fused=True),
                      critic=torch.optim.Adam(critics.parameters(), lr=args.critic_lr, fused=True))  # fmt: skip
    rb, rng, obs = ReplayBuffer(args.buffer_size, args.num_envs, fields), np.random.default_rng(seed), env.reset()
    while len(rb) < args.learning_starts:
        actions = m.act(actors, obs, "cpu", args, uniform=True)
        step = env.step(actions)
        rb.add(**joint_transition(obs, actions, step, groups))
        obs = step.next
    env.close()
    per_call = getattr(args, "policy_frequency", 1)  # MATD3: a full cycle of critic-only and actor updates
    count = itertools.count()  # MATD3's update counter

    def update():
        for _ in range(per_call):
            b = to_torch(rb.sample(args.batch_size, rng), "cpu")
            extra = (next(count),) if algo == "matd3" else ()
            losses, _ = m.update(b, nets, optimizers, args, learners, *extra)
        return losses

    update.nets = nets
    return args, update, per_call


def products_of(update):
    """The matrix products one call of `update()` makes: {(m, k, n): count}, from torch's profiler (a batched product
    of b matrices counts b times)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        update()
    counts = {}
    for e in prof.events():
        shapes = {"aten::mm": e.input_shapes[:2], "aten::bmm": e.input_shapes[:2], "aten::baddbmm": e.input_shapes[1:3]}
        if e.name in shapes:
            a, b = shapes[e.name]
            batch, (m, k), n = (a[0] if len(a) == 3 else 1), a[-2:], b[-1]
            counts[(m, k, n)] = counts.get((m, k, n), 0) + batch
    return counts


def time_products(counts, rounds=7, reps=20):
    """Seconds the products take alone: per shape the best of `rounds` means over `reps` calls, times its count."""
    total = 0.0
    for (m, k, n), count in counts.items():
        a, b = torch.randn(m, k), torch.randn(k, n)
        out = torch.empty(m, n)
        torch.mm(a, b, out=out)
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(reps):
                torch.mm(a, b, out=out)
            best = min(best, (time.perf_counter() - t0) / reps)
        total += best * count
    return total


def time_update(update, repeats=7, calls=1):
    """Median seconds of one whole update (after a warm-up), each of `repeats` timings the mean of `calls` calls."""
    for _ in range(calls):
        update()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            update()
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def timings(counts, update, env_steps, calls=1):
    """Products alone and the whole update at 1 and 2 torch threads, and the env-steps/s each allows."""
    gflop = sum(2 * mm * k * n * c for (mm, k, n), c in counts.items()) / 1e9
    out = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        products, whole = time_products(counts), time_update(update, calls=calls)
        out[f"threads_{threads}"] = dict(products_ms=products * 1e3, update_ms=whole * 1e3,
                                         products_gflops=gflop / products, ceiling_env_steps_per_s=env_steps / products,
                                         update_only_env_steps_per_s=env_steps / whole)  # fmt: skip
    return out


PRODUCT_OPS = ("aten::mm", "aten::bmm", "aten::baddbmm", "aten::addmm")


def where_time_goes(update, calls=20, top=12, per_call=1):
    """Where one update's time goes, from torch's profiler over `calls` calls of `update()` (each `per_call` updates;
    MATD3: a pair), per update in ms: the products' own time, each other ATen op's own time (the `top` largest, the
    rest summed), and what lies outside every op (Python, dispatch, autograd's engine). The profiler's overhead
    inflates each op alike; the wall time is timed apart."""
    n = calls * per_call  # updates profiled
    wall_ms = time_update(update, calls=calls) / per_call * 1e3
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            update()
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    own = {}
    for e in events:
        own[e.key] = own.get(e.key, 0.0) + e.self_cpu_time_total / 1e3 / n
    products = sum(own.pop(k, 0.0) for k in PRODUCT_OPS)
    ops = sorted(own.items(), key=lambda kv: -kv[1])
    return dict(wall_ms=wall_ms, products_ms=products, top_ops_ms=dict(ops[:top]),
                other_ops_ms=sum(v for _, v in ops[top:]),
                outside_ops_ms=max(0.0, wall_ms - products - sum(own.values())),
                op_calls=sum(e.count for e in events) / n)  # fmt: skip


def profile_report(algos):
    """The markdown of --profile: one table per script, at its defaults."""
    lines = ["# Where one update's time goes (ms per update, one torch thread)", "",
             f"Measured {date.today().isoformat()} on {cpu_name()}, torch {torch.__version__}. Regenerate: "
             f"`python bench/bench_update.py --profile --algos {','.join(algos)}`. Own time of each ATen op from "
             "torch's profiler over 20 updates (the PPO pair: 2; its overhead inflates every op a little); 'outside "
             "every op': the timed wall time minus all ops' own time (Python, dispatch, autograd's engine).",
             ""]  # fmt: skip
    torch.set_num_threads(1)
    for algo in algos:
        m = load_script(algo)
        if algo in PPO:
            args, pol, opt, rb, rng = filled_rollout(algo, m)
            update = lambda m=m, pol=pol, opt=opt, rb=rb, args=args, rng=rng: m.update(pol, opt, rb, args, "cpu", rng)  # noqa: E731
            per_call = 1
        else:
            _, update, per_call = filled_replay(algo, m, 256)
        r = where_time_goes(update, calls=2 if algo in PPO else 20, per_call=per_call)
        lines += [f"## {algo} (defaults): {r['wall_ms']:.2f} ms, {r['op_calls']:.0f} ATen op calls per update", "",
                  "| part | ms | share |", "|---|---|---|"]  # fmt: skip
        parts = [("matrix products (mm, bmm, baddbmm)", r["products_ms"]), *r["top_ops_ms"].items(),
                 ("other ATen ops", r["other_ops_ms"]), ("outside every op", r["outside_ops_ms"])]  # fmt: skip
        lines += [f"| {name} | {ms:.3f} | {ms / r['wall_ms']:.0%} |" for name, ms in parts] + [""]
    return "\n".join(lines)


def measure(algo, label=None, **flags):
    m = load_script(algo)
    args, pol, opt, rb, rng = filled_rollout(algo, m, **flags)
    update = lambda: m.update(pol, opt, rb, args, "cpu", rng)  # noqa: E731
    counts = products_of(update)
    gflop = sum(2 * mm * k * n * c for (mm, k, n), c in counts.items()) / 1e9
    env_steps = args.num_envs * args.num_steps
    row = dict(algo=algo, label=label or algo, env_steps_per_update=env_steps, samples=env_steps * 3,
               epochs=args.update_epochs, minibatches=args.num_minibatches, hidden_size=args.hidden_size,
               products=sum(counts.values()), gflop_products=gflop,
               shapes={f"{a}x{b}x{c}": n for (a, b, c), n in counts.items()})  # fmt: skip
    row |= timings(counts, update, env_steps)
    print(json.dumps(row), flush=True)
    return row


def measure_ddpg(algo, train_frequency, batch_size):
    m = load_script(algo)
    args, update, per_call = filled_replay(algo, m, train_frequency, batch_size)
    counts = products_of(update)  # of `per_call` updates
    gflop = sum(2 * mm * k * n * c for (mm, k, n), c in counts.items()) / 1e9 / per_call
    env_steps = train_frequency // args.gradient_steps
    row = dict(algo=algo, train_frequency=train_frequency, updates_per_call=per_call, env_steps_per_update=env_steps,
               batch_size=args.batch_size, hidden_size=args.hidden_size, products=sum(counts.values()) / per_call,
               gflop_products=gflop, shapes={f"{a}x{b}x{c}": n for (a, b, c), n in counts.items()})  # fmt: skip
    for key, t in timings(counts, update, env_steps * per_call, calls=max(1, 50 // per_call)).items():
        row[key] = t | {k: t[k] / per_call for k in ("products_ms", "update_ms")}  # per update
    print(json.dumps(row), flush=True)
    return row


def section(title, intro, header, align, cells, note):
    """A markdown section: title, intro lines, a table of `cells` (rows of strings), a closing note."""
    return ["", f"## {title}", "", *intro, header, align, *("| " + " | ".join(c) + " |" for c in cells), "", note]


def markdown(report):
    loads = [", ".join(f"{x:.1f}" for x in report[k]) for k in ("load_average_before", "load_average")]
    ms = lambda x: f"{x:.{1 if x >= 10 else 2}f}"  # noqa: E731

    def timed(r, threads):  # the cells of one thread count
        t = r[f"threads_{threads}"]
        return [str(threads), ms(t["products_ms"]), f"{t['products_gflops']:.0f}", ms(t["update_ms"]),
                f"{t['ceiling_env_steps_per_s']:,.0f}", f"{t['update_only_env_steps_per_s']:,.0f}"]  # fmt: skip

    timed_header = ("torch threads | products alone (ms) | their GFLOP/s | whole update (ms) | ceiling: env steps / "
                    "products' time | env steps / whole update's time |")  # fmt: skip
    ppo = [r for r in report["rows"] if "epochs" in r]
    ddpg = [r for r in report["rows"] if "train_frequency" in r]
    lines = [
        "# The update's floor: the highest env-steps/s the results' settings allow",
        "",
        f"Measured {report['date']} on {report['cpu']} ({report['cores']} cores), torch {report['torch']}, load "
        f"average {loads[0]} before and {loads[1]} after. Regenerate: `{report['command']}`.",
        f"Settings: each script's defaults on {ENV_ID} (the results' settings; one PPO row at JaxMARL's IPPO config "
        "too, that of speed/jaxmarl.md). The update's matrix products are "
        "counted by torch's profiler and timed alone at their shapes (contiguous operands, best of 7 rounds); the "
        "whole update is the median of 7 timings.",
    ]
    if ppo:
        cells = [[r.get("label", r["algo"]), f"{r['env_steps_per_update']:,}",
                  f"{r['samples']:,} x {r['epochs']} ({r['minibatches']})",
                  f"{r['gflop_products']:.2f}", *timed(r, threads)] for r in ppo for threads in (1, 2)]  # fmt: skip
        lines += section(
            "PPO: one update per rollout",
            [],
            "| script | env steps per update | samples x epochs (minibatches) | GFLOP in matrix products | "
            + timed_header,
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
            cells,
            "The ceiling counts nothing but the update's matrix products: acting, env stepping, the elementwise ops "
            "of the networks and the losses, and Adam all come on top of it. A run at these settings is therefore "
            "slower than the ceiling on this machine whatever the implementation; only fewer FLOPs per env step "
            "(fewer epochs, fewer or smaller layers, one critic value per env instead of per agent) or more cores "
            "raise it.",
        )
    if ddpg:
        cells = [[r["algo"], str(r["train_frequency"]), str(r["batch_size"]), f"{r['gflop_products'] * 1e3:.0f}",
                  *timed(r, threads)] for r in ddpg for threads in (1, 2)]  # fmt: skip
        ratios = [r["threads_1"]["update_ms"] / r["threads_1"]["products_ms"] for r in ddpg]
        lines += section(
            "DDPG family: one update per --train-frequency env steps",
            ["One update: a batch sampled from a replay buffer of --learning-starts random transitions, copied to "
             "torch, then the script's update() (targets, critic step, actor step, soft target update). MATD3's actor "
             "and targets learn every second update, so its row is the mean of a critic-only and a full update "
             "(shapes in update.json: of the pair).", ""],
            "| script | --train-frequency (env steps per update) | batch | MFLOP in matrix products | " + timed_header,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            cells,
            f"Times are per update (MATD3: the mean of a pair). On one thread the whole update takes "
            f"{min(ratios):.1f}x to {max(ratios):.1f}x the time of its products: with networks this small (64 wide, "
            "3 x batch rows) the rest is per-op dispatch, autograd, elementwise ops, Adam, sampling. The last column "
            "is what the update alone allows, before acting, env stepping, storing and evaluating.",
        )  # fmt: skip
    return "\n".join(lines + [""])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", default="mappo,ippo,maddpg,matd3,iddpg", help="comma-separated scripts")
    parser.add_argument(
        "--ddpg-settings",
        default="256x256,64x256,256x1024",
        help="--train-frequency x --batch-size pairs of the DDPG family (256x256: the defaults)",
    )
    parser.add_argument("--profile", action="store_true", help="only where each update's time goes, by ATen op "
                        "(writes update_profile.md)")  # fmt: skip
    parser.add_argument("--out", type=out_folder, default=OUT)
    args = parser.parse_args()
    algos = args.algos.split(",")
    if unknown := [a for a in algos if a not in PPO + DDPG]:
        parser.error(f"--algos {unknown}: measured are {PPO + DDPG}")
    if args.profile:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "update_profile.md").write_text(profile_report(algos) + "\n")
        print((args.out / "update_profile.md").read_text())
        return
    try:
        settings = [tuple(int(x) for x in setting.split("x", 1)) for setting in args.ddpg_settings.split(",")]
    except ValueError:
        parser.error(f"--ddpg-settings {args.ddpg_settings!r}: write train-frequency x batch-size pairs, e.g. 64x256")
    if any(len(setting) != 2 for setting in settings):
        parser.error(f"--ddpg-settings {args.ddpg_settings!r}: write train-frequency x batch-size pairs, e.g. 64x256")
    load_before = os.getloadavg()
    rows = [measure(a) for a in algos if a in PPO]
    if "ippo" in algos:
        rows.append(measure("ippo", "ippo (JaxMARL's config)", **MATCHED))
    rows += [measure_ddpg(a, f, b) for a in algos if a in DDPG for f, b in settings]
    report = dict(date=date.today().isoformat(), cpu=cpu_name(), cores=os.cpu_count(), python=platform.python_version(),
                  torch=torch.__version__, load_average_before=load_before, load_average=os.getloadavg(),
                  command="python bench/bench_update.py", rows=rows)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "update.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "update.md").write_text(markdown(report))
    print((args.out / "update.md").read_text())


if __name__ == "__main__":
    main()
