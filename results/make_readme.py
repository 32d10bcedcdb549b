"""Regenerate ``results/README.md`` and ``results/<env_id>/curves.png`` from the result JSON files.

Inputs: every ``<out>/<env_id>/<algo>.json`` (written by collect.py, checked against its schema),
the published figures in ``results/reference.json`` and the speed tables ``<out>/speed/*.md``.
The output depends on nothing else (no clock, no environment, no matplotlibrc), so running this
twice gives byte-identical files.

Usage::

    python results/make_readme.py [--out results] [--reference results/reference.json]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import json
import re
import shlex
import sys
import textwrap
from functools import cache
from pathlib import Path

import numpy as np
import tyro
from collect import (
    PER_RUN_KEYS,
    PROTOCOL,
    RESULTS_DIR,
    REWARD_CONVENTION,
    check_result,
    difference_ci,
    env_kwargs_of,
    read_json,
    result_paths,
    sample_std,
    write_whole,
)

REFERENCE_FILE = RESULTS_DIR / "reference.json"
CURVES_NAME = "curves.png"
OVERVIEW_NAME = "mpe_overview.png"  # the cooperative tasks of the overview, as a heatmap
BENCHMARK_PLOT_NAME = "epymarl_overview.png"  # the EPyMARL benchmark at a glance, as a heatmap
ROOT = RESULTS_DIR.parent  # the per-seed commands run from the repository root
REFERENCE_KEYS = {"env_id", "algo", "mean", "std", "best", "n_seeds", "total_timesteps", "protocol", "source"}


def load_results(out: Path) -> dict[str, list[dict]]:
    """env_id -> its result documents sorted by algorithm; an invalid file stops with its name."""
    by_env: dict[str, list[dict]] = {}
    for path in result_paths(out):
        result = json.loads(path.read_text())
        try:
            check_result(result)
        except ValueError as exc:
            raise SystemExit(f"error: {path}: {exc}") from None
        if (protocol := result.get("evaluation_protocol") or "v1") != "v2":
            raise SystemExit(f"error: {path}: made under evaluation protocol {protocol}, not v2 (its runs did not "
                             "measure their final policy): rerun it with its sweep command to publish it")  # fmt: skip
        by_env.setdefault(result["env_id"], []).append(result)
    return {env: sorted(results, key=lambda r: r["algo"]) for env, results in sorted(by_env.items())}


def load_references(path: Path) -> list[dict]:
    """The published figures of ``reference.json``; each entry must name its source and protocol."""
    if not Path(path).is_file():
        return []
    references = json.loads(Path(path).read_text())["references"]
    for ref in references:
        missing = REFERENCE_KEYS - set(ref)
        if missing or not ref["source"] or not ref["protocol"]:
            raise SystemExit(f"error: {path}: entry {ref} lacks {sorted(missing) or 'a source or protocol'}")
    return references


@cache
def script_args(script: str) -> type | None:
    """The ``Args`` dataclass of an ``algos/`` script, imported without running it (None if it has none)."""
    path = ROOT / script
    spec = importlib.util.spec_from_file_location(f"_results_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # tyro reads the docstrings through the module
    spec.loader.exec_module(module)
    return getattr(module, "Args", None)


def parse_script_args(script: str, argv: list[str]) -> tuple[object | None, str | None]:
    """``(args, None)``: argv parsed with the script's ``Args`` the way the script parses its command line; or
    ``(None, reason)`` where it would refuse them, reason being tyro's own line ("Unrecognized options: --rnn") rather
    than its box on stderr."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
            return tyro.cli(script_args(script), args=argv), None
    except SystemExit:
        found = re.search(r"(Unrecognized options: .*?|Error parsing .*?)\s*$", said.getvalue(), re.M)
        return None, found[1] if found else f"python {script} --help lists what it takes"


def config_drift(result: dict) -> str | None:
    """What rerunning the result's recorded command today would change, in words; None when nothing would.

    The first seed's command is parsed with the script's current ``Args`` and compared with the config the runs
    recorded: an option whose default changed since makes the row stale (its README command no longer reproduces
    it). Options added since are named too, since the recorded runs ran without them; where the script says what
    runs from before an option did (its Args.BEFORE_FLAGS), that is compared like a recorded value. Runs started by
    hand recorded no command: there is nothing to compare, and the env's section says so.
    """
    command = next((seed["command"] for seed in result["per_seed"] if seed["command"]), None)
    if command is None:
        return None
    argv = shlex.split(command)
    if len(argv) < 2 or not (ROOT / argv[1]).is_file():
        return f"its script `{argv[1] if len(argv) > 1 else argv}` no longer exists"
    if (ROOT / argv[1]).resolve().parent != ROOT / "algos":
        return None  # not one of our scripts (a test's stand-in): nothing to compare with
    args_cls = script_args(argv[1])
    if not (isinstance(args_cls, type) and dataclasses.is_dataclass(args_cls)):
        return None
    today, refusal = parse_script_args(argv[1], argv[2:])
    if refusal:
        return f"its command no longer parses (a flag was renamed or removed: {refusal})"
    recorded = getattr(args_cls, "BEFORE_FLAGS", {}) | result["config"]  # what runs older than a flag ran with
    if isinstance(recorded.get("feature_norm"), bool):  # the flag's values when it was a bool, in today's words
        from runtime.norm import FEATURE_NORM_BEFORE

        recorded = recorded | {"feature_norm": FEATURE_NORM_BEFORE[recorded["feature_norm"]]}
    options = [f.name for f in dataclasses.fields(args_cls) if f.init and f.name not in PER_RUN_KEYS]
    changed = [
        f"{key} {json.dumps(recorded[key])} → {json.dumps(value)}"
        for key in options
        if key in recorded and json.loads(json.dumps(value := getattr(today, key))) != recorded[key]
    ]
    if not changed:
        return None
    added = [key for key in options if key not in recorded]
    return f"{', '.join(changed)}" + (f"; options added since: {', '.join(added)}" if added else "")


def same_command(command: str) -> tuple:
    """A command with its options in a canonical order: two launches that differ only in the order of their flags
    are the same command (``--a 1 --b 2`` and ``--b 2 --a 1``). A quoted value of several flags (``--extra "--x 1
    --y"``) stays its option's value."""
    head, options = [], []
    for token in shlex.split(command):
        if token.startswith("--") and not any(c.isspace() for c in token):
            options.append([token])
        elif options:
            options[-1].append(token)
        else:
            head.append(token)
    return tuple(head), tuple(sorted(map(tuple, options)))


def fmt(x: float | None, digits: int = 2) -> str:
    """A number for a table cell; an em dash for a missing one."""
    return "—" if x is None else f"{x:.{digits}f}"


def n_seeds(n: int) -> str:
    """A count of seeds in words: 1 seed, 3 seeds."""
    return f"{n} seed" if n == 1 else f"{n} seeds"


def fmt_steps(steps: int | None) -> str:
    """10000000 -> '10M', 20000 -> '20k', 512 -> '512'."""
    if steps is None:
        return "—"
    for scale, suffix in [(1_000_000_000, "B"), (1_000_000, "M"), (1_000, "k")]:
        if steps >= scale:
            return f"{steps / scale:g}{suffix}"
    return str(steps)


def fmt_seconds(seconds: float | None) -> str:
    """Wall time in s, min or h."""
    if seconds is None:
        return "—"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def short_commit(commit: str) -> str:
    """The first 12 hex digits of a commit, keeping a "-dirty" suffix."""
    head, dirty, _ = commit.partition("-dirty")
    return head[:12] + dirty


def as_array(values: list) -> np.ndarray:
    """A JSON list of numbers as floats, null as NaN (matplotlib leaves a gap)."""
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


FAMILIES = {"mappo": "on-policy (PPO)", "ippo": "on-policy (PPO)", "ppo": "on-policy (PPO)", "maddpg": "DDPG family",
            "matd3": "DDPG family", "iddpg": "DDPG family", "iql": "value-based", "vdn": "value-based",
            "qmix": "value-based", "wqmix": "value-based", "dqn": "value-based", "drqn": "value-based",
            "masac": "SAC family", "isac": "SAC family"}  # fmt: skip
BASE_STYLE = "-"
VARIANT_STYLES = ("--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))  # a base's 1st variant '--', 2nd ':', ...
REFERENCE_STYLE = (0, (8, 4))  # long thin dashes: a published figure, as a horizontal line


def curve_styles(results: list[dict]) -> dict[str, list[tuple[dict, tuple, str | tuple]]]:
    """Panels of the curves figure: family -> [(result, colour, linestyle)], every pair distinct within a panel.

    A row's family is that of its base algorithm (the name before the first '-'); panels come in FAMILIES' order,
    then other bases by name. Within a panel every row has its own colour (tab10 less its grey, in name order, so a
    base and its variants sit side by side) and the line style tells the variants: the base solid, its variants
    (mappo-continuous, maddpg-tf64, ...) dashed, dotted, ... Past nine rows a colour comes back with another style
    (up to 54 rows a panel)."""
    import matplotlib

    colors = [c for i, c in enumerate(matplotlib.colormaps["tab10"].colors) if i != 7]  # no grey: the grid's
    panels: dict[str, list] = {}
    for result in sorted(results, key=lambda r: r["algo"]):
        base = result["algo"].split("-")[0]
        panels.setdefault(FAMILIES.get(base, base), []).append((result, base))
    order = list(dict.fromkeys(FAMILIES.values()))  # the same panel order in every figure, then others by name
    panels = dict(sorted(panels.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])))
    styled = {}
    for family, rows in panels.items():
        styled[family], used = [], set()
        for i, (result, base) in enumerate(rows):
            k = sum(1 for r, b in rows[:i] if b == base and r["algo"] != base)  # earlier variants of this base
            preferred = BASE_STYLE if result["algo"] == base else VARIANT_STYLES[k % len(VARIANT_STYLES)]
            color = colors[i % len(colors)]
            style = next(s for s in (preferred, BASE_STYLE, *VARIANT_STYLES) if (color, s) not in used)
            used.add((color, style))
            styled[family].append((result, color, style))
    return styled


def panel_references(panels: dict[str, list], references: list[dict]) -> dict[str, list[tuple[dict, tuple]]]:
    """The published figures (of the panels' env) each panel shows: family -> [(reference, colour)], in the colour of
    the reference's algorithm, else of the first of its listed variants that is plotted; with neither, none."""
    drawn: dict[str, list] = {family: [] for family in panels}
    for ref in sorted(references, key=lambda r: r["algo"]):
        for family, rows in panels.items():
            colors = {result["algo"]: color for result, color, _ in rows}
            algo = next((a for a in [ref["algo"], *ref.get("variants", [])] if a in colors), None)
            if algo is not None:
                drawn[family].append((ref, colors[algo]))
                break
    return drawn


def plot_curves(env_id: str, results: list[dict], path: Path, references: list[dict] = ()) -> None:
    """Mean learning curve and 95% CI band per algorithm, one panel per family (shared y axis, a legend below each),
    the published figures as horizontal lines; saved as a PNG with no varying metadata."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    panels = curve_styles(results)
    refs = panel_references(panels, [ref for ref in references if ref["env_id"] == env_id])
    legend_rows = max((len(rows) + len(refs[family]) + 1) // 2 for family, rows in panels.items())
    with matplotlib.rc_context():
        matplotlib.rcdefaults()  # ignore any matplotlibrc: the same JSON must give the same bytes
        fig = Figure(figsize=(5.2 * len(panels) + 0.4, 4.2 + 0.2 * legend_rows), dpi=100, layout="constrained")
        axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
        for ax, (family, rows) in zip(axes, panels.items(), strict=True):
            for result, color, style in rows:
                curve = result["curve"]
                steps = as_array(curve["steps"])
                label = f"{result['algo']} ({n_seeds(len(result['seeds']))})"
                ax.plot(steps, as_array(curve["mean"]), color=color, linestyle=style, linewidth=1.6, label=label)
                low, high = as_array(curve["ci95_low"]), as_array(curve["ci95_high"])
                ax.fill_between(steps, low, high, color=color, alpha=0.12, linewidth=0)
            for ref, color in refs[family]:
                label = f"{ref['algo']}: published {fmt(ref['mean'])} ({fmt_steps(ref['total_timesteps'])} steps)"
                ax.axhline(ref["mean"], color=color, linestyle=REFERENCE_STYLE, linewidth=1.1, label=label)
            ax.set_title(family, fontsize=10)
            ax.set_xlabel("environment steps")
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: fmt_steps(int(round(x))) if x > 0 else "0"))
            ax.grid(alpha=0.3)
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=2, fontsize=8, frameon=False)
        axes[0].set_ylabel("evaluation return (mean over agents)")
        about = "periodic greedy evaluations: mean and 95% bootstrap CI over seeds"
        about += "; long dashes: published figures" if any(refs.values()) else ""
        width = fig.get_figwidth() * fig.dpi / 6.5  # characters of a 10-point line that fit
        fig.suptitle(f"{env_id}\n" + textwrap.fill(about, int(width)), fontsize=10)
        save_png(fig, path)


def save_png(fig, path: Path) -> None:
    """The figure as a PNG at `path`, written whole (collect.write_whole)."""
    png = io.BytesIO()
    fig.savefig(png, format="png", metadata={"Software": None})
    write_whole(path, png.getvalue())


def reference_cell(ref: dict, note: int, brief: bool = False) -> str:
    """'-11.63 ± 1.50 (3 seeds, 10M steps, best -8.87) [1]'; [1] names the source and protocol. `brief`: without the
    entry's note (beside a variant row: the note is on the reference's own row)."""
    std = f" ± {fmt(ref['std'])}" if ref["std"] is not None else ""
    details = [
        n_seeds(ref["n_seeds"]) if ref["n_seeds"] else None,
        f"{fmt_steps(ref['total_timesteps'])} steps",
    ]
    if ref["best"] is not None:
        details.append(f"best {fmt(ref['best'])}")
    if ref.get("note") and not brief:
        details.append(ref["note"])
    return f"{fmt(ref['mean'])}{std} ({', '.join(d for d in details if d)}) [{note}]"


def note_links(directory: Path) -> str:
    """Links to the pages written by hand beside a task's results (not the generated pages nested here), or ""."""
    pages = sorted(p.name for p in directory.glob("*.md") if p.name not in NESTED_PAGES)
    return ", ".join(f"[{directory.name}/{name}]({directory.name}/{name})" for name in pages)


def demote_headings(markdown: str, levels: int = 2) -> str:
    """Push every heading (outside code fences) ``levels`` deeper, to nest a file under a section."""
    lines, in_fence = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        if not in_fence and line.startswith("#"):
            line = "#" * levels + line
        lines.append(line)
    return "\n".join(lines)


def seed_group_returns(result: dict) -> list[dict]:
    """Each seed's final policy's return per group (1000 fixed episodes; none for a single-agent env)."""
    return [p["final_policy"].get("per_group") or {} for p in result["per_seed"]]


def competitive(results: list[dict]) -> bool:
    """Whether an env's groups get different returns (adversaries vs agents), not one shared reward (speaker and
    listener) or a single group."""
    seeds = [by_group for r in results for by_group in seed_group_returns(r)]
    groups = {g for by_group in seeds for g in by_group}
    return len(groups) > 1 and any(len(set(by_group.values())) > 1 for by_group in seeds)


def group_names(seed_lists) -> list[str]:
    """The groups named in any seed's returns, sorted."""
    return sorted({g for seeds in seed_lists for by_group in seeds for g in by_group})


def group_cell(seeds: list[dict], group: str) -> str:
    values = [by_group[group] for by_group in seeds if group in by_group]
    std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return f"{fmt(float(np.mean(values)))} ± {fmt(std)}" if values else "—"


def group_table(results: list[dict]) -> list[str]:
    """Per group returns (mean ± std over seeds) where an env's groups are rewarded differently; none otherwise."""
    if not competitive(results):  # one group, or a shared reward (speaker and listener): the main table says it all
        return []
    per_seed = {r["algo"]: seed_group_returns(r) for r in results}
    frozen_groups = {r["algo"]: ", ".join(r["config"].get("random_groups") or []) for r in results}
    groups = group_names(per_seed.values())
    lines = [
        "Per group (each group's final policy's return, mean ± std over seeds; all groups learn, except those a row "
        "names as frozen to a random policy):",
        "",
        "| algorithm | " + " | ".join(f"`{g}`" for g in groups) + " |",
        "|---|" + "---|" * len(groups),
    ]
    for algo, seeds in per_seed.items():
        frozen = frozen_groups[algo]
        cells = [group_cell(seeds, g) for g in groups]
        lines.append(f"| `{algo}`{f' (frozen: {frozen})' if frozen else ''} | " + " | ".join(cells) + " |")
    return [*lines, ""]


NO_COMM = "-nocomm"  # a variant of a communication script with its messages zeroed (--no-comm)


def message_worth_table(env_id: str, ours: dict[str, dict]) -> list[str]:
    """What a communication script's messages are worth on a task: each row `<row>-nocomm` beside its `<row>`,
    the difference of their final policies with a bootstrap interval over seeds (issue 43's comm minus no-comm).
    On an EPyMARL benchmark task, in the team's totals, as the benchmark's table beside it."""
    pairs = [(a[: -len(NO_COMM)], a) for a in sorted(ours) if a.endswith(NO_COMM) and a[: -len(NO_COMM)] in ours]
    if not pairs:
        return []
    size = team_size(env_id) or 1
    scale = f" Returns are the team's total per episode (the sum over its {size} agents)." if size > 1 else ""
    lines = [
        "What the messages are worth: the final policy with messages minus the same script's with them zeroed "
        "(`--no-comm`, in training and evaluation), 95% percentile bootstrap interval over seeds (each row's seeds "
        "resampled apart); an interval above 0: the messages carry something the agents use." + scale,
        "",
        "| script | with messages | zeroed | worth [95% CI] |",
        "|---|---|---|---|",
    ]
    for comm, nocomm in pairs:
        with_, without = (team_finals(ours[r], size) for r in (comm, nocomm))
        low, high = difference_ci(with_, without)
        cells = [f"{fmt(np.mean(x))} ± {fmt(sample_std(x))} ({n_seeds(len(x))})" for x in (with_, without)]
        worth = f"{np.mean(with_) - np.mean(without):+.2f} [{low:+.2f}, {high:+.2f}]"
        lines.append(f"| `{comm}` vs `{nocomm}` | " + " | ".join(cells) + f" | {worth} |")
    return [*lines, ""]


# the EPyMARL benchmark's families (Papoudakis et al. 2021), by registry family: the task_kwargs key of the team's size
BENCHMARK_FAMILIES = {"lbf": "players", "rware": "n_agents"}


def team_size(env_id: str) -> int | None:
    """The number of agents of an EPyMARL benchmark task (Level-Based Foraging, the Multi-Robot Warehouse); None for
    any other env."""
    from envs import lookup

    entry = lookup(env_id)
    if entry is None or entry.family not in BENCHMARK_FAMILIES:
        return None
    return int(importlib.import_module(entry.module).task_kwargs(entry.task)[BENCHMARK_FAMILIES[entry.family]])


def team_finals(result: dict, size: int) -> np.ndarray:
    """Each seed's final policy as the team's total per episode: `size` agents x the mean over agents (exact, as every
    agent of a benchmark task acts to the end of the episode)."""
    return size * np.array([p["final_policy"]["mean"] for p in result["per_seed"]])


def epymarl_metrics(result: dict) -> tuple[float, float, int] | None:
    """EPyMARL's two figures of a row from its seeds' periodic evaluations: (maximum returns: the highest mean over
    seeds of one evaluation; average returns: the mean over every evaluation of every seed; evaluations a seed).

    Our scripts evaluate every seed at the same steps. EPyMARL (the `-epymarl` rows) tests at the first episode end
    past each interval, so its steps drift by up to an episode a seed, and a resumed seed tests once more where it
    resumed: each seed's evaluations are then taken on the grid of the row's --eval-interval (the last one nearest
    each multiple). None when a seed lacks its evaluations or the seeds' grids differ."""
    evaluations = [p.get("evaluations") for p in result["per_seed"]]
    if not all(evaluations):
        return None
    grid = (result.get("config") or {}).get("eval_interval")
    if len({tuple(e["steps"]) for e in evaluations}) != 1:  # a peer's drifting tests: on the grid, or no figure
        if not grid:
            return None
        on_grid = [dict(zip((round(s / grid) for s in e["steps"]), e["returns"], strict=True)) for e in evaluations]
        if len({tuple(g) for g in on_grid}) != 1:
            return None
        evaluations = [{"returns": list(g.values())} for g in on_grid]
    returns = np.array([e["returns"] for e in evaluations])  # (seeds, evaluations)
    return float(returns.mean(0).max()), float(returns.mean()), returns.shape[1]


def benchmark_table(env_id: str, ours: dict[str, dict]) -> list[str]:
    """An EPyMARL benchmark task's rows in the benchmark's conventions: the team's total return per episode (the sum
    over its agents, not the mean), and its maximum and average returns beside our final policy (issue 42)."""
    size = team_size(env_id)
    if size is None or not ours:
        return []
    lines = [
        f"In the EPyMARL benchmark's conventions (Papoudakis et al. 2021): returns are the team's total per episode, "
        f"the sum over its {size} agents ({size} x the mean over agents of the table above; exact, as every agent "
        "acts to the end of the episode). Maximum returns: the highest mean over seeds of one periodic evaluation; "
        "average returns: the mean of every periodic evaluation of every seed, early ones included (EPyMARL's two "
        "figures: the first picks the best evaluation after the fact, so it sits above what a policy chosen in "
        "advance scores; the second measures how fast a row learns); the final policy, on the fixed 1000 episodes, "
        "is our headline.",
        "",
        "| algorithm | **final policy**, team total: mean ± std over seeds | maximum returns | average returns | "
        "periodic evaluations a seed (every n steps) |",
        "|---|---|---|---|---|",
    ]
    for algo, result in sorted(ours.items()):
        finals = team_finals(result, size)
        cells = [f"`{algo}`", f"**{fmt(finals.mean())} ± {fmt(sample_std(finals))}** ({n_seeds(finals.size)})"]
        if metrics := epymarl_metrics(result):
            best, average, count = metrics
            every = result["config"].get("eval_interval")
            cells += [
                fmt(size * best),
                fmt(size * average),
                f"{count}" + (f" (every {fmt_steps(every)})" if every else ""),
            ]
        else:
            cells += ["—", "—", "— (not recorded, or at different steps between seeds)"]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


# the EPyMARL benchmark's algorithms that we have, in its table's order, each at its defaults, and their budget there:
# 2M env steps off-policy, 10x that on-policy (results/epymarl_benchmark.md)
BENCHMARK_ROWS = {"iql": 2_000_000, "vdn": 2_000_000, "qmix": 2_000_000, "maddpg-discrete": 2_000_000,
                  "ippo": 20_000_000, "mappo": 20_000_000, "coma": 20_000_000}  # fmt: skip


def benchmark_tasks(by_env: dict[str, list[dict]]) -> dict[str, dict[str, dict]]:
    """The EPyMARL benchmark's tasks among the results, in the benchmark's order (the registry's: LBF from 8x8 up,
    then RWARE): {env_id: {row label: its result}}."""
    from envs.registry import REGISTRY

    return {env: {r["algo"]: r for r in by_env[env]} for env in REGISTRY if env in by_env and team_size(env)}


def budget_note(result: dict, budget: int) -> str:
    """What a benchmark row was made with other than the benchmark's budget and 3 seeds ("1M, 2 seeds"); "" if
    nothing."""
    other = [fmt_steps(result.get("total_timesteps"))] if result.get("total_timesteps") != budget else []
    return ", ".join(other + ([n_seeds(len(result["per_seed"]))] if len(result["per_seed"]) != 3 else []))


def benchmark_overview(by_env: dict[str, list[dict]], plot: str = "") -> list[str]:
    """The EPyMARL benchmark's tasks x its algorithms at a glance, in its conventions: a cell is the team's total of
    the final policy, mean ± std over seeds, EPyMARL's maximum returns in brackets; the task's best mean in bold; a
    budget or seed count other than the benchmark's said in the cell. Variants and the rest: the task sections. `plot`:
    the heatmap's path, shown above the table."""
    tasks = benchmark_tasks(by_env)
    if not tasks:
        return []
    lines = ["## The EPyMARL benchmark at a glance", "",
             "Level-Based Foraging and the Multi-Robot Warehouse (issue 42; protocol, task versions and costs: "
             "[epymarl_benchmark.md](epymarl_benchmark.md)). Each cell: the team's total return of the final policy "
             "on the fixed 1000 episodes, mean ± std over 3 seeds, and in brackets EPyMARL's maximum returns (the "
             "best mean over seeds of one periodic evaluation, picked after the fact); the task's best final policy "
             "in bold. Every script at its defaults and the benchmark's budget, 2M steps off-policy (`iql`, `vdn`, "
             "`qmix`, `maddpg-discrete`) and 20M on-policy (`ippo`, `mappo`, `coma`); a cell made otherwise says "
             "so. \"—\": not run yet. Who wins where, and why: "
             "[epymarl_benchmark.md](epymarl_benchmark.md#who-wins-where-and-why).", "",
             *([f"![the EPyMARL benchmark at a glance]({plot})", ""] if plot else []),
             "| task | " + " | ".join(f"`{a}`" for a in BENCHMARK_ROWS) + " |",
             "|---" * (len(BENCHMARK_ROWS) + 1) + "|"]  # fmt: skip
    for env_id, rows in tasks.items():
        size = team_size(env_id)
        finals = {algo: team_finals(rows[algo], size) for algo in BENCHMARK_ROWS if algo in rows}
        best = max((x.mean() for x in finals.values()), default=None)
        cells = []
        for algo, budget in BENCHMARK_ROWS.items():
            if algo not in finals:
                cells.append("—")
                continue
            x, result = finals[algo], rows[algo]
            cell = f"{fmt(x.mean())} ± {fmt(sample_std(x))}"
            cell = f"**{cell}**" if fmt(x.mean()) == fmt(best) else cell
            if metrics := epymarl_metrics(result):
                cell += f" [{fmt(size * metrics[0])}]"
            other = budget_note(result, budget)
            cells.append(cell + (f" ({other})" if other else ""))
        lines.append(f"| {env_id} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def final_policy_cell(result: dict) -> str:
    """The headline: the final policies on the fixed episode set (protocol v2: final_eval.json of every seed)."""
    final = result["summary"]["final_policy"]
    episodes = {p["final_policy"]["episodes"] for p in result["per_seed"]}
    return f"**{fmt(final['mean'])} ± {fmt(final['std'])}** ({n_seeds(final['n'])}, {max(episodes)} ep. each)"


# the overview's columns: issue 23's matrix first, then the scripts that joined it
MATRIX_ORDER = (
    "mappo",
    "ippo",
    "maddpg",
    "matd3",
    "iddpg",
    "masac",
    "isac",
    "iql",
    "vdn",
    "qmix",
    "wqmix",
    "coma",
    "vdac",
    "mfq",
    "mfac",
    "qtran",
    "dcg",
    "happo",
    "commnet",
    "ic3net",
    "tarmac",
)
NESTED_PAGES = ("tournament.md", "crossplay.md")  # written into this page whole, not linked as notes
MATRIX_VARIANT = "3m"  # the matrix's rows: <env>/<algo>-3m.json, every script at its defaults for 3M steps
MPE_TASKS = ("simple_v3", "simple_adversary_v3", "simple_crypto_v3", "simple_push_v3", "simple_reference_v3",
             "simple_speaker_listener_v4", "simple_spread_v3", "simple_tag_v3", "simple_world_comm_v3")  # fmt: skip
COOPERATIVE_TASKS = ("simple_v3", "simple_reference_v3", "simple_speaker_listener_v4", "simple_spread_v3")
MATRIX_FLAGS = f"--seeds 0,1,2 --total-timesteps 3000000 --variant {MATRIX_VARIANT}"
MATRIX_COMMANDS = (  # the scripts that train each group apart run every task; one-team scripts, the cooperative ones
    f"python results/run.py --algos mappo,ippo,maddpg,matd3,iddpg,masac,isac,iql,coma,mfq,mfac "
    f"--envs {','.join(MPE_TASKS)} {MATRIX_FLAGS}",
    f"python results/run.py --algos vdn,qmix,wqmix,vdac,qtran,dcg,happo,commnet,ic3net,tarmac "
    f"--envs {','.join(COOPERATIVE_TASKS)} {MATRIX_FLAGS}",
)


def overview_cells(by_env: dict[str, list[dict]]) -> tuple[list[str], dict, dict]:
    """The overview's algorithms, its rows ({env: {algo: result or None}}: the matrix row <algo>-3m where there is one,
    else the script's own row) and its numbers ({env: {algo: (final-policy mean, std, budget label, tags) or None}});
    tags: "stale"."""
    mpe = {env: {r["algo"]: r for r in results} for env, results in by_env.items() if env.startswith("simple")}
    pick = {
        env: {a: rows.get(f"{a}-{MATRIX_VARIANT}") or rows.get(a) for a in MATRIX_ORDER} for env, rows in mpe.items()
    }
    algos = [a for a in MATRIX_ORDER if any(rows[a] for rows in pick.values())]
    numbers = {}
    for env_id, rows in pick.items():
        numbers[env_id] = {}
        for algo in algos:
            result, cell = rows[algo], None
            if result is not None:
                steps, stale = fmt_steps(result["total_timesteps"]), ("stale",) if config_drift(result) else ()
                final = result["summary"]["final_policy"]
                cell = (final["mean"], final["std"], steps, stale)
            numbers[env_id][algo] = cell
    return algos, pick, numbers


def draw_heatmap(path: Path, rows: list[str], algos: list[str], shade: np.ndarray, texts: list[list[str]],
                 hatched: np.ndarray, title: str) -> None:  # fmt: skip
    """A tasks x algorithms heatmap: `shade` (NaN: no cell, a grey dash) in viridis from 0 to 1, each cell's text on
    it, a hatch over the cells made otherwise than the rest (another budget: not to be compared by colour alone)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    with matplotlib.rc_context():
        matplotlib.rcdefaults()  # the same JSON must give the same bytes
        fig = Figure(figsize=(1.0 + 0.82 * len(algos), 1.4 + 0.62 * len(rows)), dpi=100, layout="constrained")
        ax = fig.subplots()
        ax.imshow(np.ma.masked_invalid(shade), cmap="viridis", vmin=0, vmax=1, aspect="auto")
        for i in range(len(rows)):
            for j in range(len(algos)):
                if np.isnan(shade[i, j]):
                    ax.text(j, i, "—", ha="center", va="center", fontsize=8, color="0.5")
                    continue
                if hatched[i, j]:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", edgecolor=(1, 1, 1, 0.3),
                                           linewidth=0))  # fmt: skip
                ax.text(j, i, texts[i][j], ha="center", va="center", fontsize=7.5,
                        color="black" if shade[i, j] > 0.6 else "white")  # fmt: skip
        ax.set_xticks(range(len(algos)), algos, fontsize=8, rotation=30, ha="right")
        ax.set_yticks(range(len(rows)), rows, fontsize=8)
        ax.set_title(title, fontsize=9)
        save_png(fig, path)


def plot_overview(algos: list[str], numbers: dict, path: Path) -> bool:
    """The cooperative tasks of the overview as a heatmap: each cell's final-policy mean, coloured by where it lies
    between the worst and the best cell of its task (yellow: the best). Returns whether there was anything to draw."""
    tasks = [t for t in COOPERATIVE_TASKS if t in numbers and any(numbers[t].values())]
    if not tasks:
        return False
    grid = np.full((len(tasks), len(algos)), np.nan)
    texts = [[""] * len(algos) for _ in tasks]
    hatched = np.zeros(grid.shape, bool)
    for i, task in enumerate(tasks):
        for j, algo in enumerate(algos):
            if (cell := numbers[task][algo]) is not None:
                grid[i, j] = cell[0]
                hatched[i, j] = cell[2] != "3M"
                budget = f"\n{cell[2]}" if hatched[i, j] else ""
                texts[i][j] = f"{cell[0]:.2f}{'*' if cell[3] else ''}{budget}"
    low, high = np.nanmin(grid, axis=1, keepdims=True), np.nanmax(grid, axis=1, keepdims=True)
    shade = (grid - low) / np.where(high > low, high - low, 1.0)
    title = ("Cooperative MPE: final policy (mean over seeds, 3M steps unless marked)\ncolour: from the task's worst "
             "cell (dark) to its best (yellow); hatched: another budget; *: stale")  # fmt: skip
    names = [t.removesuffix("_v3").removesuffix("_v4") for t in tasks]
    draw_heatmap(path, names, algos, shade, texts, hatched, title)
    return True


def plot_benchmark(by_env: dict[str, list[dict]], path: Path) -> bool:
    """The EPyMARL benchmark at a glance as a heatmap: each cell the team's total of the final policy (mean over
    seeds), coloured as a fraction of the task's best cell (yellow: the best; dark: nothing collected or
    delivered). Returns whether there was anything to draw."""
    tasks = benchmark_tasks(by_env)
    if not tasks:
        return False
    algos = list(BENCHMARK_ROWS)
    grid = np.full((len(tasks), len(algos)), np.nan)
    texts = [[""] * len(algos) for _ in tasks]
    hatched = np.zeros(grid.shape, bool)
    for i, (env_id, rows) in enumerate(tasks.items()):
        for j, (algo, budget) in enumerate(BENCHMARK_ROWS.items()):
            if algo in rows:
                grid[i, j] = team_finals(rows[algo], team_size(env_id)).mean()
                other = budget_note(rows[algo], budget)
                hatched[i, j] = bool(other)
                texts[i][j] = f"{grid[i, j]:.2f}" + (f"\n{other}" if other else "")
    best = np.nanmax(grid, axis=1, keepdims=True)
    shade = np.clip(grid / np.where(best > 0, best, 1.0), 0, 1)
    title = ("EPyMARL benchmark: the team's total of the final policy\n(mean over 3 seeds; 2M steps off-policy, 20M "
             "on-policy)\ncolour: fraction of the task's best cell; hatched: another budget or seeds")  # fmt: skip
    draw_heatmap(path, list(tasks), algos, shade, texts, hatched, title)
    return True


def overview_table(cells: tuple[list[str], dict, dict], crossplay: bool = False, plot: str = "") -> list[str]:
    """MPE tasks x algorithms at a glance: each script's final policy (mean ± std over seeds) and its budget, from
    the matrix row (<algo>-3m) where there is one, else the script's own row; `cells`: overview_cells()'s. `plot`:
    the heatmap's path, shown above the table."""
    algos, pick, numbers = cells
    if not algos:
        return []
    lines = ["## MPE at a glance", "",
             "Final policies (protocol v2), mean ± std over seeds, and the budget each cell was "
             f"trained for: compare cells of equal budget. A cell is the matrix's row (`<algo>-{MATRIX_VARIANT}`, "
             "every script at its defaults, 3 seeds x 3M steps) where there is one, else the script's own row. "
             "Variants are in the task sections below; \"stale\": made with older defaults of its script (its section "
             "says which). The matrix (vdn, qmix, wqmix and vdac train one team on one "
             "reward, and refuse the competitive tasks with a clear error):", "",
             "```bash", *MATRIX_COMMANDS, "```", ""]  # fmt: skip
    if plot:
        lines += [f"![cooperative MPE tasks at a glance]({plot})", ""]
    lines += ["| task | " + " | ".join(f"`{a}`" for a in algos) + " |", "|---" * (len(algos) + 1) + "|"]
    for env_id in sorted(pick):
        cells = []
        for algo in algos:
            cell = numbers[env_id][algo]
            if cell is None:
                cells.append("—")
            else:
                mean, std, steps, tags = cell
                cells.append(f"{fmt(mean)} ± {fmt(std)} ({', '.join((steps, *tags))})")
        lines.append(f"| {env_id} | " + " | ".join(cells) + " |")
    lines += ["", "What the matrix shows, task by task, and why a script fails where it does: "
              "[mpe_matrix.md](mpe_matrix.md).", ""]  # fmt: skip
    contests = {env: rows for env, rows in sorted(pick.items()) if competitive([r for r in rows.values() if r])}
    if not contests:
        return lines
    lines += ["On the competitive tasks the team mean above mixes opponents. Each group's return (mean ± std over "
              "seeds; every group learns against the other, with the same script):", "",
              "| task | group | " + " | ".join(f"`{a}`" for a in algos) + " |",
              "|---" * (len(algos) + 2) + "|"]  # fmt: skip
    for env_id, rows in contests.items():
        returns = {a: seed_group_returns(rows[a]) if rows[a] else [] for a in algos}
        for group in group_names(returns.values()):
            cells = [group_cell(seeds, group) for seeds in returns.values()]
            lines.append(f"| {env_id} | `{group}` | " + " | ".join(cells) + " |")
    if crossplay:
        lines += ["", "A group's return here is its script's own equilibrium; whose team is better is settled by "
                  "[cross-play](#cross-play) below (every script's team against every script's other)."]  # fmt: skip
    return [*lines, ""]


def env_section(env_id: str, results: list[dict], references: list[dict], notes: list[tuple]) -> list[str]:
    """The Markdown of one environment: results table, reference notes, curves, run details.

    ``notes`` collects the (source, protocol) pairs cited so far, numbered across the whole page.
    """
    refs = {ref["algo"]: ref for ref in references if ref["env_id"] == env_id}
    ours = {result["algo"]: result for result in results}
    # a reference also stands beside those of our variants it lists (same setting, another cadence or batch)
    variant_refs = {v: ref for ref in refs.values() for v in ref.get("variants", []) if v in ours}
    lines = [f"## {env_id}", ""]
    lines += [
        "| algorithm | **final policy**, fixed 1000 episodes: mean ± std over seeds | periodic evaluations, last 10: "
        "mean ± std (n seeds) | IQM [95% CI] | best eval (mean) | reference | budget (steps) |",
        "|---|---|---|---|---|---|---|",
    ]
    drift = {algo: config_drift(result) for algo, result in ours.items()}
    for algo in sorted(set(ours) | set(refs)):
        marks = " (stale)" if drift.get(algo) else ""
        marks += " (env kwargs)" if algo in ours and env_kwargs_of(ours[algo]) else ""
        cells = [f"`{algo}`{marks}", "—", "not run yet", "—", "—", "—", "—"]
        if algo in ours:
            result = ours[algo]
            final, best = result["summary"]["final_eval_return"], result["summary"]["best_eval_return"]
            low, high = final["iqm_ci95"]
            cells[1] = final_policy_cell(result)
            cells[2] = f"{fmt(final['mean'])} ± {fmt(final['std'])} ({n_seeds(final['n'])})"
            cells[3] = f"{fmt(final['iqm'])} [{fmt(low)}, {fmt(high)}]"
            cells[4] = fmt(best["mean"]) if best else "—"
            cells[6] = fmt_steps(result["total_timesteps"])
        if ref := refs.get(algo) or variant_refs.get(algo):
            source = (ref["source"], ref["protocol"])
            if source not in notes:
                notes.append(source)
            cells[5] = reference_cell(ref, notes.index(source) + 1, brief=algo not in refs)
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for algo, result in sorted(ours.items()):
        if kwargs := env_kwargs_of(result):
            lines += [
                f"(env kwargs): `{algo}` trained and was evaluated with `--env-kwargs '{json.dumps(kwargs)}'`: "
                "its returns are of that env, which may score another quantity than the standard one.",
                "",
            ]
    lines += group_table(results)
    lines += message_worth_table(env_id, ours)
    lines += benchmark_table(env_id, ours)
    for number in sorted({notes.index((r["source"], r["protocol"])) + 1 for r in refs.values()}):
        source, protocol = notes[number - 1]
        lines += [f"[{number}] {source}. Protocol: {protocol}.", ""]
    if not results:
        return lines
    lines += [f"![{env_id} learning curves]({env_id}/{CURVES_NAME})", ""]
    lines += [
        "| algorithm | seeds | commit | date | SPS (mean) | wall time (mean) | hardware |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        sps, wall = result["summary"]["sps"], result["summary"]["wall_time_s"]
        hardware = "; ".join(
            f"{h.get('cpu')} ({h.get('cores')} cores, {h.get('ram_gb')} GB)" + (f", {h['gpu']}" if h.get("gpu") else "")
            for h in result["hardware"]
        )
        cells = [
            f"`{result['algo']}`",
            ", ".join(str(s) for s in result["seeds"]),
            ", ".join(f"`{short_commit(c)}`" for c in result["commit"].split(", ")),
            result["date"] or "—",
            fmt(sps["mean"], 0) if sps else "—",
            fmt_seconds(wall["mean"] if wall else None),
            hardware or "—",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    commands: dict[tuple, str] = {}  # one line per command, whatever the order its flags were given in
    for result in results:
        for command in result["sweep_commands"] or result["commands"][:1]:
            commands.setdefault(same_command(command), command)
    commands = list(commands.values())
    lines += ["", "Commands:", "", "```bash", *commands, "```", ""] if commands else [""]
    for result in results:
        if not result["sweep_commands"] and not result["commands"]:
            lines += [
                f"`{result['algo']}`: its runs recorded no command (started by hand, not by results/run.py), so "
                "neither how to rerun them nor whether their script's defaults changed since can be told here.",
                "",
            ]
    for algo, changes in drift.items():
        if changes:
            if "→" in changes:
                why = f"with older defaults; its command run today would differ in {changes}. Rerun it to measure "
                why += "today's defaults; to reproduce the row as it stands, give those options their values before "
                why += "the arrow"
            else:  # the script or a flag is gone
                why = f"with older code: {changes}; each run's config.json records what it ran"
            lines += [f"**Stale: `{algo}`** was made {why}.", ""]
    return lines


FINAL_POLICY_PROTOCOL = (
    "evaluation protocol v2: at the end of every run the script plays its final policy greedily on"
    " the standard env over a fixed set of 1000 episodes (env i seeded 10000 + i), the same for every algorithm and"
    " seed, so rows compare pairwise (final_eval.json in the run dir); the cell is the mean ± std over seeds of the"
    " per-seed means."
)


def render(
    out: Path,
    by_env: dict[str, list[dict]],
    references: list[dict],
    plot: bool = False,
    cells: tuple | None = None,
    benchmark_plot: bool = False,
) -> str:
    """The whole README as a string; ``plot``: the overview's heatmap was
    drawn (shown above its table); ``cells``: the overview's, if already computed (overview_cells())."""
    lines = [
        "# Results",
        "",
        "<!-- Generated by results/make_readme.py from results/<env_id>/<algo>.json, results/reference.json",
        "     <env_id>/tournament.md and speed/*.md. Do not edit by hand: rerun `python results/make_readme.py`. -->",
        "",
        "Final evaluation returns of every algorithm, beside published figures where they exist.",
        "Each number is read from a JSON file in this directory (`<env_id>/<algo>.json`, which also holds",
        "the commit, the exact commands, the resolved config, the per-seed numbers and the curves).",
        "",
        "Reproduce a row, then regenerate this page:",
        "",
        "```bash",
        "python results/run.py --algos mappo --envs simple_spread_v3 --seeds 5 --total-timesteps 10000000",
        "python results/make_readme.py",
        "```",
        "",
        "How the numbers are made:",
        "",
        f"* Reward: {REWARD_CONVENTION}.",
        f"* Final policy (headline): {FINAL_POLICY_PROTOCOL}",
        f"* Periodic evaluations, last 10: {PROTOCOL['final_eval_return']}; under v2 each evaluation plays fresh "
        "episodes (no start state twice in a run, none shared between seeds).",
        f"* Best eval: {PROTOCOL['best_eval_return']}.",
        f"* Across seeds: {PROTOCOL['mean_std']}.",
        f"* IQM: {PROTOCOL['iqm']}.",
        f"* 95% CI: {PROTOCOL['ci95']}.",
        f"* Curves: {PROTOCOL['curve']}.",
        "* Reference figures are quoted as published, with their source and protocol; not rerun here.",
        "",
    ]
    envs = sorted(set(by_env) | {ref["env_id"] for ref in references})
    if not envs:
        lines += ["No results yet.", ""]
    crossplays = sorted(Path(out).glob("*/crossplay.md"))
    cells = cells or overview_cells(by_env)
    lines += overview_table(cells, bool(crossplays), OVERVIEW_NAME if plot else "")
    lines += benchmark_overview(by_env, BENCHMARK_PLOT_NAME if benchmark_plot else "")
    notes: list[tuple] = []
    for env_id in envs:
        lines += env_section(env_id, by_env.get(env_id, []), references, notes)
        if links := note_links(Path(out) / env_id):  # screens and diagnoses written beside the results: linked
            lines += [f"Notes on {env_id} (protocols, screens and diagnoses beside the rows above): {links}.", ""]
    tournaments = sorted(Path(out).glob("*/tournament.md"))
    if tournaments:  # results/tournament.py: its page, nested, with its heatmap's path from here
        lines += ["## Tournaments", ""]
        for path in tournaments:
            env_dir = path.parent.name
            text = path.read_text().strip().replace("](tournament.png)", f"]({env_dir}/tournament.png)")
            lines += [f"From [{env_dir}/tournament.md]({env_dir}/tournament.md):", ""]
            if links := note_links(path.parent):
                lines += [f"Its reading and protocol, in the notes beside it: {links}.", ""]
            lines += [demote_headings(text), ""]
    if crossplays:  # results/crossplay.py: every task's teams at a glance, then each page nested
        import crossplay

        lines += ["## Cross-play", ""]
        if table := crossplay.summary([read_json(path.with_suffix(".json")) or {} for path in crossplays]):
            lines += ["Each script's team against every script's opposing team (its own included), mean over those "
                      "opponents, its self-play cell in brackets; higher is better for the team named, the best in "
                      "bold; \"—\": not in that task's cross-play. The matrices of each task follow.", "",
                      table]  # fmt: skip
        for path in crossplays:
            lines += [f"From [{path.parent.name}/crossplay.md]({path.parent.name}/crossplay.md):", ""]
            lines += [demote_headings(path.read_text().strip()), ""]
    speed_files = sorted((Path(out) / "speed").glob("*.md"))
    if speed_files:
        lines += ["## Speed", ""]
        for path in speed_files:
            lines += [f"From [speed/{path.name}](speed/{path.name}):", ""]
            lines += [demote_headings(path.read_text().strip()), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def generate(out: Path = RESULTS_DIR, reference: Path = REFERENCE_FILE) -> Path:
    """Write ``<out>/README.md`` and ``<out>/<env_id>/curves.png`` per env; returns the README path."""
    out = Path(out)
    by_env = load_results(out)
    references = load_references(reference)
    for env_id, results in by_env.items():
        plot_curves(env_id, results, out / env_id / CURVES_NAME, references)
    readme = out / "README.md"
    cells = overview_cells(by_env)
    plot = plot_overview(cells[0], cells[2], out / OVERVIEW_NAME)
    benchmark_plot = plot_benchmark(by_env, out / BENCHMARK_PLOT_NAME)
    for name, drawn in ((OVERVIEW_NAME, plot), (BENCHMARK_PLOT_NAME, benchmark_plot)):
        if not drawn:
            (out / name).unlink(missing_ok=True)
    write_whole(readme, render(out, by_env, references, plot, cells, benchmark_plot))
    return readme


def main(argv: list[str] | None = None) -> int:
    """CLI: regenerate the README and the curves."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results root (default: results/)")
    parser.add_argument("--reference", type=Path, default=REFERENCE_FILE, help="published figures to compare")
    args = parser.parse_args(argv)
    if not args.out.is_dir():
        parser.error(f"--out {args.out}: no such folder (a results root holds <env_id>/<algo>.json)")
    if not args.reference.is_file():
        parser.error(f"--reference {args.reference}: no such file (the published figures; default {REFERENCE_FILE})")
    print(f"wrote {generate(args.out, args.reference)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
