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
