"""Repository hygiene that a green working tree can hide."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands():
    return re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), flags=re.S)


def test_ci_runs_exactly_the_readme_test_command():
    test_cmd = [c for c in readme_commands() if "pytest" in c]
    assert len(test_cmd) == 1, "README must show exactly one test command"
    ci_lines = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln and not ln.startswith("#")]
    assert test_cmd[0].strip() in ci_lines, ".ci/run must run the README's test command verbatim"


def test_torch_load_always_weights_only():
    offenders = []
    for path in ROOT.glob("*/**/*.py"):
        if ".venv" in path.parts or "build" in path.parts:
            continue
        for call in re.findall(r"torch\.load\([^)]*\)", path.read_text()):
            if "weights_only=True" not in call:
                offenders.append(f"{path.relative_to(ROOT)}: {call}")
    assert not offenders, offenders


SCRIPTS = sorted((ROOT / "algos").glob("*.py"))


def test_scripts_hold_the_algorithm_and_the_layer_holds_the_plumbing():
    """Each script is as `ruff format` writes it, with no `# fmt: skip` (nothing packed to pass a count), at most 500
    lines so formatted; its training loop (main) starts in the first 60% of the file; and the run around it
    (writers, checkpoints, signals, progress bars) is runtime/'s, never copied back into a script."""
    import subprocess
    import sys

    ruff = [sys.executable, "-m", "ruff", "format", "--check", *SCRIPTS]
    check = subprocess.run(ruff, capture_output=True, text=True)
    assert check.returncode == 0, f"not as ruff formats them:\n{check.stdout}{check.stderr}"
    plumbing = ("SummaryWriter", "signal.signal", "torch.save", "torch.load", "wandb.init", "tqdm(", "os.replace")
    for path in SCRIPTS:
        lines = path.read_text().splitlines()
        main = next(i for i, line in enumerate(lines) if line.startswith("def main("))
        assert not [ln for ln in lines if "fmt: skip" in ln], f"{path.name} opts lines out of the formatter"
        assert len(lines) <= 500, f"{path.name}: {len(lines)} lines"
        assert main / len(lines) <= 0.6, f"{path.name}: main starts at line {main + 1} of {len(lines)}"
        assert not [p for p in plumbing if p in path.read_text()], f"{path.name} does the layer's work"
        assert 'if __name__ == "__main__":\n    cli(Args, main)\n' in path.read_text(), path.name


def test_every_flag_has_help_text():
    """Every field of every Args (and of the shared RunArgs / MultiAgentArgs) is followed by its docstring."""
    import ast

    missing = []
    for path in [*SCRIPTS, ROOT / "runtime" / "args.py"]:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Args"):
                body = node.body
                for i, stmt in enumerate(body):
                    doc = body[i + 1] if i + 1 < len(body) else None
                    if isinstance(stmt, ast.AnnAssign) and not (
                        isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
                    ):
                        missing.append(f"{path.name}: {node.name}.{stmt.target.id}")
    assert not missing, missing


def sibling_imports(folder: Path, package: str | None) -> dict[str, set[str]]:
    """module -> the modules of the same folder it imports, at its top or inside a function (a package's
    `__init__` is not a node: it gathers, it is not depended on). `package`: how the modules name each other
    (`runtime.args`); None for scripts that import siblings by bare name (results/: `from collect import ...`)."""
    import ast

    modules = {p.stem for p in folder.glob("*.py")} - {"__init__"}
    graph = {}
    for path in folder.glob("*.py"):
        if path.stem == "__init__":
            continue
        named = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                named |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                named |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        parts = [n.split(".") for n in named]
        if package:
            deps = {p[1] for p in parts if len(p) > 1 and p[0] == package and p[1] in modules}
        else:
            deps = {p[0] for p in parts if p[0] in modules}
        graph[path.stem] = deps - {path.stem}
    return graph


def import_circle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of the graph as a path [a, b, ..., a], or [] if the imports go one way."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_imports_go_one_way_inside_every_folder():
    """No import circle between the modules of runtime/, buffers/, envs/, results/, bench/ or probes/, lazy imports
    included: a circle makes the order modules load in matter, and hides which one is the base."""
    assert import_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check itself
    packages = [("runtime", "runtime"), ("buffers", "buffers"), ("envs", "envs")]
    for folder, package in [*packages, ("results", None), ("bench", None), ("probes", None)]:
        circle = import_circle(sibling_imports(ROOT / folder, package))
        assert not circle, f"{folder}/: {' -> '.join(circle)}"


# results/ holds the pipeline that makes the published numbers, and the numbers; bench/ the scripts that write the
# speed tables of results/speed/ (and the two helpers they share); probes/ the studies that results/'s notes quote.
# (epymarl_peer.py: a peer's rows, EPyMARL run and played on our protocol, through collect.py like ours)
PIPELINE = {"run.py", "collect.py", "make_readme.py", "crossplay.py", "tournament.py", "epymarl_peer.py",
            "epymarl_launch.py"}  # fmt: skip
DATA = {".json", ".jsonl", ".md", ".png", ".pt"}  # .jsonl: a tournament's finished pairs, committed while it runs
BENCH_HELPERS = {"host.py", "compare_losses.py"}  # imported by the benchmarks; they write no table themselves
PROBES = {
    "comm_probe.py",
    "foraging_inputs.py",
    "comm_screens.py",
    "mpe_ceiling.py",
    "spread_levels.py",
    "spread_behaviour.py",
    "spread_credit.py",
    "spread_encoder.py",
    "spread_study.py",
    "qtran_probe.py",
    "greedy_actions.py",
    "qmix_epymarl_gap.py",
}


def repository_files() -> list[Path]:
    """Every file git tracks or would track (untracked but not ignored), relative to the root."""
    import subprocess

    listing = ["git", "ls-files", "--cached", "--others", "--exclude-standard"]
    files = subprocess.run(listing, cwd=ROOT, capture_output=True, text=True, check=True).stdout.splitlines()
    return [Path(f) for f in files if (ROOT / f).exists()]


def test_each_top_level_folder_holds_one_kind_of_thing():
    files = repository_files()
    under = lambda folder: [f.relative_to(folder) for f in files if f.parts[0] == folder]  # noqa: E731
    results = under("results")
    scripts = {str(f) for f in results if f.suffix == ".py"}
    assert scripts == PIPELINE, f"results/ holds the pipeline only: move {sorted(scripts - PIPELINE)} out"
    assert not [f for f in results if f.suffix not in DATA | {".py"}], "results/: besides the pipeline, data only"
    bench = {str(f) for f in under("bench")}
    assert {f for f in bench if not f.startswith("bench_")} == {"cuda_check.py", "compare_commits.py"} | BENCH_HELPERS
    for name in sorted(bench - BENCH_HELPERS):  # each writes its table where the speed tables are published
        assert 'ROOT / "results" / "speed"' in (ROOT / "bench" / name).read_text(), f"bench/{name}"
    assert {str(f) for f in under("probes")} == PROBES
    notes = "".join(p.read_text() for p in (ROOT / "results").rglob("*.md") if "speed" not in p.parts)
    assert not [name for name in PROBES if f"probes/{name}" not in notes], "a probe no note in results/ quotes"


def test_the_readme_layout_names_every_top_level_folder():
    block = re.search(r"## Layout\n\n```\n(.*?)\n```", (ROOT / "README.md").read_text(), flags=re.S).group(1)
    listed = set(re.findall(r"^(\w+)/ ", block, flags=re.M))
    folders = {f.parts[0] for f in repository_files() if len(f.parts) > 1 and not f.parts[0].startswith(".")}
    assert listed == folders, f"README's layout: missing {sorted(folders - listed)}, gone {sorted(listed - folders)}"


# scripts a note still quotes as they were run, kept out of the tree on purpose; the note says where they went
RETIRED = {
    "results/eval_final.py": "protocol v1's final evaluation (tuning.md: read it at f144c61)",
    "probes/spread_inputs.py": "replaced by --relations (agents.md)",
}


def test_every_command_a_note_quotes_names_a_script_that_exists():
    """`python bench/bench_ports.py` in a published note or table (and the command a speed table records) is what a
    reader runs to regenerate it: a script that moved must not leave its old path behind."""
    ours = {f.parts[0] for f in repository_files() if len(f.parts) > 1}
    quoted = {}
    for f in repository_files():
        if f.suffix in (".md", ".json"):
            for path in re.findall(r"python ([a-z_]+/[\w/]+\.py)", (ROOT / f).read_text(errors="replace")):
                if path.split("/")[0] in ours:  # not a peer's own script (EPyMARL's src/main.py)
                    quoted.setdefault(path, str(f))
    missing = {p: f for p, f in quoted.items() if not (ROOT / p).exists() and p not in RETIRED}
    assert not missing, f"notes quote scripts that are not there (script: a note quoting it): {missing}"
    assert all(not (ROOT / p).exists() for p in RETIRED), "a retired script is back: drop it from RETIRED"
