"""The off-policy actor-critics end to end with tiny budgets: algos/maddpg.py, matd3.py, iddpg.py, masac.py, isac.py.

One smoke run per script, Ctrl-C and one error are subprocesses (a fresh interpreter, the real CLI). The other checks
execute the same script as ``__main__`` inside the test process (`runpy`): the identical code path, without paying
the torch import for each extra run on a 2-core machine.
"""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import script_runs
import torch

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ["maddpg", "matd3", "iddpg", "masac", "isac"]
TINY = ["--backend", "pettingzoo", "--num-envs", "2", "--eval-episodes", "2", "--buffer-size", "1000",
        "--batch-size", "16", "--learning-starts", "32", "--train-frequency", "4", "--log-interval", "20",
        "--final-eval-episodes", "4"]  # fmt: skip
LOSSES = ("losses/qf_loss", "losses/actor_loss", "losses/q_values")
WORLD_COMM_GROUPS = ["leadadversary", "adversary", "agent"]


def run(algo, *flags, check=True):
    """The script in this process, answering as subprocess.run would (script_runs.run_captured)."""
    return script_runs.run_captured(ROOT / "algos" / f"{algo}.py", *TINY, *flags, check=check)


def run_inline(capsys, algo, *flags, check=True):
    """Execute the script as __main__ in this process; returns (exit code, stdout, stderr)."""
    return script_runs.run_inline(capsys, algo, *TINY, *flags, check=check)


scalars = script_runs.scalars


def first_final_returns(run_dir, n=2):
    """The mean return of the first n episodes of the run's final evaluation (protocol v2's fixed episode set)."""
    return float(np.mean(json.loads((run_dir / "final_eval.json").read_text())["returns"][:n]))


@pytest.mark.parametrize("algo", ALGOS)
def test_continuous_spread_writes_events_checkpoints_and_reloads(algo, tmp_path, capsys):
    run(algo, "--total-timesteps", 200, "--eval-interval", 100, "--run-dir", tmp_path)
    for name in ("config.json", "last.pt", "best.pt", "final_eval.json", "DONE"):
        assert (tmp_path / name).exists(), name
    assert len(scalars(tmp_path, "eval/episodic_return")) == 2
    for tag in (*LOSSES, "charts/SPS", "charts/episodic_return", "charts/episodic_length"):
        assert scalars(tmp_path, tag), tag
    ckpt = torch.load(tmp_path / "last.pt", weights_only=True)
    assert (
        ckpt["global_step"] == 200 and ckpt["algo"] == algo and ckpt["counters"]["num_updates"] == (200 - 32) // 4 + 1
    )
    # greedy evaluation of the reloaded checkpoint replays the first episodes of the run's final evaluation exactly
    _, stdout, _ = run_inline(capsys, algo, "--eval-checkpoint", tmp_path / "last.pt")
    reloaded = float(re.search(r"episodic return (-?[\d.]+)", stdout).group(1))
    assert reloaded == pytest.approx(first_final_returns(tmp_path), abs=0.01)


@pytest.mark.parametrize("algo", ALGOS)
def test_same_seed_same_first_losses_and_another_seed_differs(algo, tmp_path, capsys):
    common = ["--total-timesteps", 100, "--eval-episodes", 1]
    # evaluations draw from their own random stream: an evaluation in between changes no loss
    for name, seed, every in (("a", 3, 0), ("b", 3, 50), ("c", 4, 0)):
        run_inline(capsys, algo, *common, "--seed", seed, "--eval-interval", every, "--run-dir", tmp_path / name)
    for tag in LOSSES:
        a, b, c = (scalars(tmp_path / name, tag) for name in "abc")
        assert a and a == b, tag
        assert a != c, tag  # the check above is not vacuous


@pytest.mark.parametrize(
    "algo, flags, groups",
    [
        ("maddpg", ["--env", "simple_speaker_listener_v4", "--no-continuous-actions", "--prioritized",
                    "--critic-state"], ["speaker", "listener"]),
        ("maddpg", ["--env", "simple_adversary_v3", "--no-share-params", "--random-groups", "adversary"], []),
        ("matd3", ["--env", "simple_adversary_v3", "--no-continuous-actions", "--share-params", "--prioritized"],
         ["adversary", "agent"]),
        ("matd3", ["--env", "simple_speaker_listener_v4", "--gradient-steps", 2], ["speaker", "listener"]),
        ("iddpg", ["--env", "simple_speaker_listener_v4", "--prioritized"], ["speaker", "listener"]),
        ("iddpg", ["--no-continuous-actions", "--no-share-params"], []),
        # three groups with different observation and action sizes (the lead adversary also speaks)
        ("maddpg", ["--env", "simple_world_comm_v3", "--no-continuous-actions"], WORLD_COMM_GROUPS),
        ("matd3", ["--env", "simple_world_comm_v3", "--share-params"], WORLD_COMM_GROUPS),
        # action masks (the env fails on a masked-out action), a unit that dies mid-episode, termination
        ("maddpg", ["--env", "test_envs:make_scripted_env", "--no-continuous-actions", "--critic-state"], []),
        ("matd3", ["--env", "test_envs:make_scripted_env", "--no-continuous-actions", "--share-params"], []),
        # SAC: categorical with masks and a centralized critic on the state; heterogeneous groups; prioritized
        ("masac", ["--env", "test_envs:make_scripted_env", "--no-continuous-actions", "--critic-state"], []),
        ("masac", ["--env", "simple_world_comm_v3", "--no-continuous-actions", "--prioritized"], WORLD_COMM_GROUPS),
        ("isac", ["--env", "simple_speaker_listener_v4", "--no-share-params", "--prioritized"],
         ["speaker", "listener"]),
        ("isac", ["--env", "test_envs:make_scripted_env", "--no-continuous-actions"], []),
    ],
)  # fmt: skip
def test_discrete_heterogeneous_prioritized_and_frozen_groups(algo, flags, groups, tmp_path, capsys):
    run_inline(capsys, algo, *flags, "--total-timesteps", 100, "--eval-interval", 0, "--run-dir", tmp_path)
    assert (tmp_path / "DONE").exists() and scalars(tmp_path, "eval/episodic_return")
    for tag in LOSSES:  # the mean over the learning agents, and one per group when several groups learn
        assert scalars(tmp_path, tag) and all(scalars(tmp_path, f"{tag}/{g}") for g in groups), tag
    if "--random-groups" in flags:  # the frozen group has no critic and logs no losses of its own
        critics = torch.load(tmp_path / "last.pt", weights_only=True)["nets"]["critics"]
        assert {k.split(".")[0] for k in critics} == {"agent"}
    if "--prioritized" in flags:
        assert scalars(tmp_path, "charts/beta")


def test_numba_backend_smoke(tmp_path, capsys):
    flags = ["--backend", "numba", "--num-envs", 8, "--total-timesteps", 400, "--eval-interval", 0]
    run_inline(capsys, "maddpg", *flags, "--run-dir", tmp_path)
    assert '"env_class": "MPEVecEnv"' in (tmp_path / "config.json").read_text()
    assert scalars(tmp_path, "losses/qf_loss") and (tmp_path / "DONE").exists()


def test_ctrl_c_saves_last_checkpoint_and_resume_continues(tmp_path, capsys):
    cmd = [sys.executable, str(ROOT / "algos" / "matd3.py"), *TINY, "--total-timesteps", "10000000"]
    proc = subprocess.Popen([*cmd, "--run-dir", str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.time() + 120
    while not scalars(tmp_path, "losses/qf_loss") and time.time() < deadline:  # wait for the first updates
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=180)  # saving under a loaded CI can be slow
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr and f"--resume {tmp_path}" in stdout
    stopped = torch.load(tmp_path / "last.pt", weights_only=True)
    assert stopped["global_step"] >= 40 and stopped["counters"]["num_updates"] > 0
    # --resume: same weights, optimizers, counters and replay buffer, so the updates go on at once:
    # 100 env steps at 2 envs and one update per 4 env steps are 25 updates (a refill of 32 steps would skip 8)
    assert (tmp_path / "replay.npz").exists()
    end = stopped["global_step"] + 100
    _, out, _ = run_inline(capsys, "matd3", "--total-timesteps", end, "--eval-interval", 0, "--resume", tmp_path)
    assert f"resumed with the {min(stopped['global_step'], 1000)} transitions" in out
    ckpt = torch.load(tmp_path / "last.pt", weights_only=True)
    assert ckpt["global_step"] == end and ckpt["counters"]["num_updates"] == stopped["counters"]["num_updates"] + 25
    assert max(s for s, _ in scalars(tmp_path, "charts/SPS")) == end and (tmp_path / "DONE").exists()


def test_nan_loss_stops_with_a_clear_error_and_a_sound_last_checkpoint_that_resumes(tmp_path, capsys):
    flags = ["--total-timesteps", 400, "--actor-lr", 1e30, "--critic-lr", 1e30, "--run-dir", tmp_path]
    code, _, stderr = run_inline(capsys, "maddpg", *flags, check=False)
    assert code == 2 and "Traceback" not in stderr
    line = stderr.strip().splitlines()[-1]
    assert re.match(r"error: the (critic|actor) loss became .*last.pt holds step 0", line), stderr[-500:]
    assert not (tmp_path / "DONE").exists()
    last = torch.load(tmp_path / "last.pt", weights_only=True)
    assert all(v.abs().max() < 10 for sd in last["nets"].values() for v in sd.values())  # the initial weights
    run_inline(capsys, "maddpg", "--resume", tmp_path, "--actor-lr", 1e-3, "--critic-lr", 1e-3)
    assert (tmp_path / "DONE").exists() and torch.load(tmp_path / "last.pt", weights_only=True)["global_step"] == 400


@pytest.mark.parametrize(
    "algo, flags, message",
    [
        ("maddpg", ["--env", "no_such_env_v0"], "unknown env id"),
        ("iddpg", ["--env-kwargs", "{bad json"], "--env-kwargs is not valid JSON"),
        ("matd3", ["--random-groups", "zombies"], "--random-groups ['zombies']"),
        ("maddpg", ["--eval-checkpoint", "/no/such/file.pt"], "does not exist"),
    ],
)
def test_bad_input_fails_with_one_clear_error(algo, flags, message, capsys):
    code, _, stderr = run_inline(capsys, algo, *flags, check=False)
    assert code == 2 and "Traceback" not in stderr
    assert stderr.startswith("error:") and message.lower() in stderr.lower(), stderr


def test_env_without_continuous_actions_fails_in_a_fresh_interpreter():
    proc = run("matd3", "--env", "battle_v4", check=False)  # continuous actions are the default
    assert proc.returncode == 2 and proc.stdout == ""
    assert re.fullmatch(r"error: battle_v4 has no continuous actions .*; use --no-continuous-actions\n", proc.stderr)


def test_corrupt_foreign_or_mismatched_checkpoint_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint at all")
    code, _, stderr = run_inline(capsys, "iddpg", "--eval-checkpoint", bad, check=False)
    assert code == 2 and "unreadable" in stderr and "Traceback" not in stderr
    run_inline(capsys, "maddpg", "--total-timesteps", 50, "--eval-interval", 0, "--run-dir", tmp_path / "r")
    last = tmp_path / "r" / "last.pt"
    code, _, stderr = run_inline(capsys, "matd3", "--eval-checkpoint", last, check=False)
    assert code == 2 and "not a matd3 checkpoint" in stderr
    other_env = ["--env", "simple_adversary_v3", "--eval-checkpoint", last]
    code, _, stderr = run_inline(capsys, "maddpg", *other_env, check=False)
    assert code == 2 and "was trained on simple_spread_v3, not simple_adversary_v3" in stderr
    code, _, stderr = run_inline(capsys, "maddpg", "--hidden-size", 32, "--eval-checkpoint", last, check=False)
    assert code == 2 and "--hidden-size 64 (checkpoint) vs 32 (now)" in stderr


@pytest.mark.parametrize("algo", ALGOS)
def test_resume_keeps_the_best_checkpoint_of_before(algo, tmp_path, capsys, resume_keeps_best):
    """Checkpoints carry the best evaluation so far, so a resumed run replaces best.pt only with a better one."""
    go = lambda steps, *flags: run_inline(capsys, algo, "--total-timesteps", steps, "--eval-interval", 40, *flags)  # noqa: E731
    resume_keeps_best(tmp_path, lambda: go(80, "--run-dir", tmp_path), lambda: go(160, "--resume", tmp_path), scalars)
