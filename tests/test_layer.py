"""The layer's docstring is a whole script: written to a file, it trains, evaluates, reloads and plays."""

import importlib.util
import json
import textwrap
from pathlib import Path

import numpy as np
import script_runs
import torch

import runtime
from envs import make
from runtime.checkpoint import read_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def example_script(tmp_path) -> Path:
    doc = runtime.__doc__
    code = doc[doc.index("A whole script:") + len("A whole script:") : doc.index("(tests/test_layer.py")]
    path = tmp_path / "example.py"
    path.write_text(textwrap.dedent(code).strip() + "\n")
    return path


def run(script, *flags):
    """The script in this process, answering as subprocess.run would (script_runs.run_captured)."""
    return script_runs.run_captured(script, *flags, check=False)


def test_the_layers_example_is_a_script_that_trains_evaluates_reloads_and_plays(tmp_path):
    script, run_dir = example_script(tmp_path), tmp_path / "run"
    assert "Adam learning rate" in run(script, "--help").stdout  # the field's docstring is its --help line
    flags = ["--env-id", "simple_spread_v3", "--num-envs", "8", "--eval-episodes", "2", "--final-eval-episodes", "4"]
    done = run(script, *flags, "--total-timesteps", "1600", "--eval-interval", "800", "--run-dir", run_dir)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (run_dir / "DONE").exists() and json.loads((run_dir / "final_eval.json").read_text())["episodes"] == 4
    played = run(script, "--eval-checkpoint", run_dir / "last.pt", "--env-id", "simple_spread_v3")
    assert played.returncode == 0 and "return" in played.stdout, played.stderr[-2000:]
    bad = run(script, *flags, "--learning-rate", "-1", "--run-dir", tmp_path / "bad")
    assert bad.returncode == 2 and "--learning-rate" in bad.stderr and "Traceback" not in bad.stderr

    spec_ = importlib.util.spec_from_file_location("example", script)
    module = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(module)
    ckpt = read_checkpoint(str(run_dir / "last.pt"))
    env = make("simple_spread_v3", 3, 0, backend="numba")
    group, spec = next(iter(env.groups.items()))
    obs = env.reset()
    actions = module.actor(ckpt, group, spec, torch.device("cpu"))(3, np.random.default_rng(0))(obs, None)[group]
    net = module.policy(spec)
    net.load_state_dict(ckpt["nets"][group])
    want = net(torch.as_tensor(obs.obs[group]).flatten(2)).argmax(-1).numpy()
    np.testing.assert_array_equal(actions, want)  # the checkpoint plays the greedy actions of its weights
    env.close()
