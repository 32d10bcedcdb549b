"""algos/vdac.py: VDAC-mix's monotonicity, VDAC-sum's sum, dead agents in V_tot, and the script end to end with tiny
budgets (in this process via `runpy`)."""

import json
import re
import runpy
from pathlib import Path

import numpy as np
import pytest
import script_runs
import torch

from envs.api import GroupSpec

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--num-envs", "2", "--num-steps", "10", "--eval-episodes", "2", "--final-eval-episodes", "4",
        "--update-epochs", "2"]  # fmt: skip
SCRIPTED = "test_envs:make_scripted_env"  # action masks, a unit that dies mid-episode (tests/test_envs.py)
SPECS = {
    "unit": GroupSpec("unit", ("u0", "u1", "u2"), (4,), np.float32, True, 5),
    "scout": GroupSpec("scout", ("s0",), (2,), np.float32, True, 3),
}


@pytest.fixture(scope="module")
def vdac():
    return runpy.run_path(str(ROOT / "algos" / "vdac.py"), run_name="vdac")


def run_inline(capsys, *flags, check=True):
    return script_runs.run_inline(capsys, "vdac", *TINY, *flags, check=check)


def test_vdac_mix_is_monotonic_in_every_local_value(vdac):
    torch.manual_seed(0)
    net = vdac["VDAC"](SPECS, 9, vdac["Args"](mixer="mix"))
    values = (5 * torch.randn(32, 4)).requires_grad_()
    v_tot = net.v_tot(values, 3 * torch.randn(32, 9), torch.ones(32, 4))
    (grad,) = torch.autograd.grad(v_tot.sum(), values)
    assert v_tot.shape == (32,) and (grad >= 0).all() and (grad > 0).any()


def test_vdac_sum_is_the_sum_of_the_living_agents_values(vdac):
    net = vdac["VDAC"](SPECS, 9, vdac["Args"](mixer="sum"))
    values, alive = torch.randn(8, 4), (torch.rand(8, 4) < 0.6).float()
    torch.testing.assert_close(net.v_tot(values, torch.randn(8, 9), alive), (values * alive).sum(-1))
    assert net.mixer is None and not any("mixer" in k for k in net.state_dict())


@pytest.mark.parametrize("mixer", ["mix", "sum"])
def test_spread_writes_events_checkpoints_and_reloads_to_the_same_greedy_actions(mixer, tmp_path, capsys):
    run_inline(capsys, "--mixer", mixer, "--total-timesteps", 200, "--eval-interval", 100, "--run-dir", tmp_path)
    for name in ("config.json", "last.pt", "best.pt", "final_eval.json", "DONE"):
        assert (tmp_path / name).exists(), name
    for tag in ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/explained_variance"):
        assert script_runs.scalars(tmp_path, tag), tag
    _, stdout, _ = run_inline(capsys, "--eval-checkpoint", tmp_path / "last.pt")  # its --mixer comes from the file
    reloaded = float(re.search(r"episodic return (-?[\d.]+)", stdout).group(1))
    final = json.loads((tmp_path / "final_eval.json").read_text())["returns"][:2]
    assert reloaded == pytest.approx(float(np.mean(final)), abs=0.01)


def test_same_seed_same_first_losses_and_another_seed_differs(tmp_path, capsys):
    for name, seed, every in (("a", 3, 0), ("b", 3, 40), ("c", 4, 0)):  # an evaluation in between changes nothing
        run_inline(capsys, "--total-timesteps", 80, "--eval-episodes", 1, "--seed", seed, "--eval-interval", every,
                   "--run-dir", tmp_path / name)  # fmt: skip
    for tag in ("losses/policy_loss", "losses/value_loss"):
        a, b, c = (script_runs.scalars(tmp_path / name, tag) for name in "abc")
        assert a and a == b and a != c, tag


@pytest.mark.parametrize(
    "flags",
    [["--mixer", "sum", "--update-epochs", 1], ["--env", "simple_speaker_listener_v4"]],
)
def test_masks_a_dying_unit_and_two_groups_in_one_team(flags, tmp_path, capsys):
    """The scripted env fails on a masked-out action, and its unit_2 dies mid-episode; speaker and listener are two
    groups of one team."""
    env = [] if "--env" in flags else ["--env", SCRIPTED]
    run_inline(capsys, *env, "--total-timesteps", 120, "--eval-interval", 0, "--run-dir", tmp_path, *flags)
    assert (tmp_path / "DONE").exists() and script_runs.scalars(tmp_path, "losses/value_loss")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--continuous-actions"], "vdac needs discrete actions"),
        (["--env", "simple_adversary_v3"], "are rewarded differently, so they compete"),
        (["--num-minibatches", 100], "--num-minibatches 100 exceeds the rollout's 20 env steps"),
    ],
)
def test_bad_input_fails_with_one_clear_error(flags, message, capsys):
    code, _, stderr = run_inline(capsys, *flags, check=False)
    assert code == 2 and "Traceback" not in stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("error:") and message.lower() in line.lower(), stderr


def test_default_normalizes_the_inputs_keeps_the_statistics_in_the_checkpoint_and_reloads_to_the_same_actions(
    tmp_path, capsys
):
    """The regression test of VDAC's failure on simple_reference (-17.26 without input normalization, -8.00 with:
    results/mpe_matrix.md): by default the inputs are normalized, and the statistics travel with the checkpoint."""
    run_inline(capsys, "--total-timesteps", 200, "--eval-interval", 0, "--run-dir", tmp_path)
    nets = torch.load(tmp_path / "last.pt", weights_only=True)["nets"]["vdac"]
    assert nets["agents.agent.obs_norm.count"] > 0 and nets["state_norm.count"] > 0  # updated after each rollout
    assert nets["agents.agent.obs_norm.var"].ne(1).any()
    _, stdout, _ = run_inline(capsys, "--eval-checkpoint", tmp_path / "last.pt")  # --feature-norm from the file
    reloaded = float(re.search(r"episodic return (-?[\d.]+)", stdout).group(1))
    final = json.loads((tmp_path / "final_eval.json").read_text())["returns"][:2]
    assert reloaded == pytest.approx(float(np.mean(final)), abs=0.01)


def test_a_checkpoint_from_before_the_flag_reloads_without_input_normalization(tmp_path, capsys):
    """Checkpoints written before --feature-norm existed ran without it: their args lack the flag, and they must
    reload as `none` (BEFORE_FLAGS), not as today's default, whose statistics they do not hold."""
    run_inline(capsys, "--feature-norm", "none", "--total-timesteps", 40, "--eval-interval", 0, "--run-dir", tmp_path)
    ckpt = torch.load(tmp_path / "last.pt", weights_only=True)
    del ckpt["args"]["feature_norm"]
    torch.save(ckpt, tmp_path / "old.pt")
    code, stdout, stderr = run_inline(capsys, "--eval-checkpoint", tmp_path / "old.pt", check=False)
    assert code == 0 and "episodic return" in stdout, stderr
