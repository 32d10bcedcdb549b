"""simple_spread_v3 against the number of agents (issue 46): the learners' rows beside the levels: a table, a plot.

    python probes/spread_study.py        # -> results/simple_spread_v3/agents/returns.md and returns.png

Reads every row in results/simple_spread_v3/agents/ (result JSON of results/collect.py, moved there so the task's
own table of N = 3 rows stays as it is; N from each row's --env-kwargs), the published N = 3 rows named in PUBLISHED,
and the levels of probes/spread_levels.py (agents/levels.json). A row's point is the mean over its seeds of each
seed's final policy (protocol v2's 1,000 fixed episodes of mpe2's own env), its bar the spread of the seeds (min to
max). The output depends on the JSON only (no clock, no matplotlibrc).
"""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "results" / "simple_spread_v3"
OUT = TASK / "agents"
PUBLISHED = ("mappo", "mappo-relations", "mappo-3m", "ippo-3m")  # the task's own rows (N = 3; 10M, and 3M cells)
LEVELS = (("scripted", "scripted controller"), ("nearest", "nearest landmark"), ("no-op", "stand still"))


def n_agents(result: dict) -> int:
    kwargs = result["config"].get("env_kwargs") or "{}"
    return int((json.loads(kwargs) if isinstance(kwargs, str) else kwargs).get("N", 3))


def setting(result: dict) -> str:
    """The row's label without its N and budget, then its budget: `mappo-relations-n6` (10M) -> `mappo-relations,
    10M`; `mappo-n6-3m` and `mappo-3m` -> `mappo, 3M`."""
    name = re.sub(r"-(n\d+|\d+m)(?=-|$)", "", result["algo"])
    return f"{name}, {steps(result['total_timesteps'])}"


def rows() -> dict[str, dict[int, dict]]:
    """setting (with its budget) -> N -> {mean, min, max, seeds, steps} of the seeds' final policies."""
    results = [json.loads(p.read_text()) for p in sorted(OUT.glob("*.json")) if p.name != "levels.json"]
    results += [json.loads((TASK / f"{a}.json").read_text()) for a in PUBLISHED if (TASK / f"{a}.json").exists()]
    table: dict[str, dict[int, dict]] = {}
    for r in results:
        finals = [s["final_policy"]["mean"] for s in r["per_seed"] if s.get("final_policy")]
        if finals:
            point = dict(
                mean=sum(finals) / len(finals),
                min=min(finals),
                max=max(finals),
                seeds=len(finals),
                steps=r["total_timesteps"],
            )
            table.setdefault(setting(r), {})[n_agents(r)] = point
    return table


def levels() -> dict[str, dict[int, float]]:
    data = json.loads((OUT / "levels.json").read_text())
    return {key: {row["N"]: row[key]["mean"] for row in data["rows"]} for key, _ in LEVELS}


def steps(n: int) -> str:
    return f"{n / 1e6:g}M"


def cell(p: dict | None) -> str:
    if p is None:
        return "–"
    seeds = f"{p['seeds']} seed{'s' * (p['seeds'] > 1)}"
    return f"{p['mean']:.2f} ({seeds}; {p['min']:.2f} to {p['max']:.2f})"


def markdown(table, level) -> str:
    ns = sorted({n for points in level.values() for n in points})
    lines = ["| setting | " + " | ".join(f"N = {n}" for n in ns) + " |", "|---|" + "---:|" * len(ns)]
    for name, label in LEVELS:
        lines.append(f"| {label} | " + " | ".join(f"{level[name][n]:.2f}" for n in ns) + " |")
    for name, points in sorted(table.items()):
        lines.append(f"| {name} | " + " | ".join(cell(points.get(n)) for n in ns) + " |")
    return "\n".join(lines) + "\n"


def plotted(table, level) -> dict[str, dict[int, dict]]:
    """The settings the plot draws: those with a point at every N (the table has the rest: shorter budgets, single
    N), so that each line is one study row across N."""
    every_n = {n for points in level.values() for n in points}
    return {name: points for name, points in sorted(table.items()) if set(points) == every_n}


def script_of(name: str) -> tuple[str, bool]:
    """A setting's script and whether it is a variant: `mappo-relations, 10M` -> (`mappo`, True)."""
    label = name.split(",")[0]
    return label.split("-")[0], "-" in label


def plot(table, level, path: Path) -> None:
    """plotted(): one colour per script, its defaults drawn solid, a variant (`mappo-relations`) dashed; the levels
    in grey."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    curves = plotted(table, level)
    scripts = sorted({script_of(name)[0] for name in curves})
    colour = {s: f"C{i}" for i, s in enumerate(scripts)}
    with matplotlib.rc_context():
        matplotlib.rcdefaults()
        fig = Figure(figsize=(8.4, 4.6), dpi=100, layout="constrained")
        ax = fig.subplots()
        for (name, label), style in zip(LEVELS, ("--", "-.", ":"), strict=True):
            ns = sorted(level[name])
            ax.plot(ns, [level[name][n] for n in ns], color="grey", linestyle=style, marker=".", label=label)
        for name, points in curves.items():
            ns = sorted(points)
            mean = [points[n]["mean"] for n in ns]
            err = [
                [points[n]["mean"] - points[n]["min"] for n in ns],
                [points[n]["max"] - points[n]["mean"] for n in ns],
            ]
            script, variant = script_of(name)
            style = dict(linestyle="--", marker="s") if variant else dict(linestyle="-", marker="o")
            ax.errorbar(ns, mean, yerr=err, capsize=3, color=colour[script], label=name, **style)
        ax.set_xticks(sorted({n for p in level.values() for n in p}))
        ax.set_xlabel("agents (and landmarks), N")
        ax.set_ylabel("final policy: return per agent (1,000 fixed episodes)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
        title = "simple_spread_v3 against N: mean of the seeds, bars from the worst seed to the best"
        fig.suptitle(f"{title} (the other rows: returns.md)", fontsize=9)
        fig.savefig(path, format="png", metadata={"Software": None})


def main() -> int:
    table, level = rows(), levels()
    (OUT / "returns.md").write_text(markdown(table, level))
    plot(table, level, OUT / "returns.png")
    print(markdown(table, level), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
