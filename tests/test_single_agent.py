"""algos/ppo.py, algos/dqn.py and algos/drqn.py end to end with tiny budgets.

The smoke runs and Ctrl-C are subprocesses (a fresh interpreter, the real CLI). The other checks execute the
same script as ``__main__`` inside the test process (`runpy`): the identical code path, without paying the
torch import for each of the ~20 extra runs on a 2-core machine.
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
TINY = {
    "ppo": ["--num-envs", "2", "--num-steps", "32", "--update-epochs", "2", "--eval-episodes", "2",
            "--final-eval-episodes", "4"],
    "dqn": ["--learning-starts", "100", "--batch-size", "16", "--train-frequency", "4",
            "--target-network-frequency", "50", "--eval-episodes", "2", "--final-eval-episodes", "4"],
    "drqn": ["--learning-starts", "120", "--batch-size", "4", "--train-frequency", "4",
             "--target-network-frequency", "50", "--eval-episodes", "2", "--final-eval-episodes", "4"],
}  # fmt: skip
STEPS = {"ppo": 128, "dqn": 300, "drqn": 300}  # ppo: two rollouts of 2 envs x 32 steps
LOSS = {"ppo": "losses/value_loss", "dqn": "losses/td_loss", "drqn": "losses/td_loss"}


def run(algo, *flags, check=True):
    """The script in this process, answering as subprocess.run would (script_runs.run_captured)."""
    return script_runs.run_captured(ROOT / "algos" / f"{algo}.py", *TINY[algo], *flags, check=check)


def run_inline(capsys, algo, *flags, check=True):
    """Execute the script as __main__ in this process; returns (exit code, stdout, stderr)."""
    return script_runs.run_inline(capsys, algo, *TINY[algo], *flags, check=check)


scalars = script_runs.scalars


def first_final_returns(run_dir, n=2):
    """The mean return of the first n episodes of the run's final evaluation (protocol v2's fixed episode set)."""
    return float(np.mean(json.loads((run_dir / "final_eval.json").read_text())["returns"][:n]))


@pytest.mark.parametrize(
    "algo, flags, reload",
    [
        ("ppo", [], True),
        ("ppo", ["--env", "Pendulum-v1", "--norm-obs", "--norm-reward", "--ent-coef", "0"], True),
        ("dqn", [], False),
        ("dqn", ["--prioritized"], False),
        ("dqn", ["--n-step", "3"], False),
        ("dqn", ["--dueling"], True),
        ("drqn", [], True),
        ("drqn", ["--seq-len", "0", "--burn-in", "2"], False),
    ],
)
def test_smoke_run_writes_events_checkpoints_and_reloads(algo, flags, reload, tmp_path, capsys):
    steps = STEPS[algo]
    run(algo, *flags, "--total-timesteps", steps, "--eval-interval", steps // 2, "--run-dir", tmp_path)
    for name in ("config.json", "last.pt", "best.pt", "final_eval.json", "DONE"):
        assert (tmp_path / name).exists(), name
    assert len(scalars(tmp_path, "eval/episodic_return")) == 2
    for tag in (LOSS[algo], "charts/SPS", "charts/learning_rate"):
        assert scalars(tmp_path, tag), tag
    if "Pendulum-v1" not in flags:  # Pendulum's episodes last 200 steps per env: none ends in this budget
        assert scalars(tmp_path, "charts/episodic_return") and scalars(tmp_path, "charts/episodic_length")
    ckpt = torch.load(tmp_path / "last.pt", weights_only=True)
    assert ckpt["global_step"] == steps and ckpt["algo"] == algo
    if reload:  # greedy evaluation of the reloaded checkpoint (its env and network flags come with it) replays the
        # first episodes of the run's final evaluation exactly
        _, stdout, _ = run_inline(capsys, algo, "--eval-checkpoint", tmp_path / "last.pt")
        reloaded = float(re.search(r"episodic return (-?[\d.]+)", stdout).group(1))
        assert reloaded == pytest.approx(first_final_returns(tmp_path), abs=0.01)


@pytest.mark.parametrize("algo", ["ppo", "dqn", "drqn"])
def test_same_seed_same_first_losses_and_another_seed_differs(algo, tmp_path, capsys):
    common = ["--total-timesteps", STEPS[algo], "--eval-interval", 0, "--eval-episodes", 1]
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        run_inline(capsys, algo, *common, "--seed", seed, "--run-dir", tmp_path / name)
    a, b, c = (scalars(tmp_path / name, LOSS[algo]) for name in "abc")
    assert a and a == b
    assert a != c  # the check above is not vacuous
    other = "losses/policy_loss" if algo == "ppo" else "losses/q_values"
    assert scalars(tmp_path / "a", other) == scalars(tmp_path / "b", other)


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_resume_continues_the_step_counter(algo, tmp_path, capsys):
    steps, common = STEPS[algo], ["--eval-interval", 0, "--eval-episodes", 1]
    run_inline(capsys, algo, "--total-timesteps", steps, *common, "--run-dir", tmp_path)
    run_inline(capsys, algo, "--total-timesteps", 2 * steps, *common, "--resume", tmp_path)
    every = 64 if algo == "ppo" else 100  # one point per rollout / per 100 env steps
    # sorted: in one process the event files are named ...<pid>.9, ...<pid>.10, which TensorBoard reads out of order
    assert sorted(s for s, _ in scalars(tmp_path, "charts/SPS")) == list(range(every, 2 * steps + 1, every))
    assert torch.load(tmp_path / "last.pt", weights_only=True)["global_step"] == 2 * steps
    assert (tmp_path / "DONE").exists()


@pytest.mark.parametrize("algo", ["dqn", "drqn"])
def test_ctrl_c_saves_checkpoint_and_replay_and_resume_trains_at_once(algo, tmp_path, capsys):
    cmd = [sys.executable, str(ROOT / "algos" / f"{algo}.py"), *TINY[algo], "--total-timesteps", "10000000"]
    proc = subprocess.Popen([*cmd, "--run-dir", str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.time() + 120
    while not scalars(tmp_path, "losses/td_loss") and time.time() < deadline:  # wait for training to start
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=180)  # saving under a loaded CI can be slow
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr and f"--resume {tmp_path}" in stdout
    stopped = torch.load(tmp_path / "last.pt", weights_only=True)["global_step"]
    assert stopped >= 200 and (tmp_path / "replay.npz").exists()
    # --resume reloads the replay buffer: training goes on at once instead of after --learning-starts steps
    # (100 dqn, 120 drqn) of refill, so the losses logged within the next 100 steps exist only with the buffer
    end = stopped + 100
    _, out, _ = run_inline(capsys, algo, "--total-timesteps", end, "--eval-interval", 0, "--resume", tmp_path)
    assert re.search(r"resumed with the [1-9]\d* (transitions|episodes)", out), out
    assert [s for s, _ in scalars(tmp_path, LOSS[algo]) if s > stopped]
    # last.pt is now the end's, newer than the stop's replay.npz (as after a kill -9 past a periodic last.pt): a
    # further resume must not pair those weights with that older buffer
    _, out, _ = run_inline(capsys, algo, "--total-timesteps", end + 50, "--eval-interval", 0, "--resume", tmp_path)
    assert "is not from the stop that wrote last.pt" in out and "resumed with the" not in out


def test_nan_loss_stops_with_a_clear_error_and_saves_last_checkpoint(tmp_path, capsys):
    flags = ["--total-timesteps", 400, "--learning-rate", 1e30, "--eval-episodes", 1, "--run-dir", tmp_path]
    code, _, stderr = run_inline(capsys, "dqn", *flags, check=False)
    assert code == 2 and "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("error: the TD loss became")
    assert (tmp_path / "last.pt").exists() and not (tmp_path / "DONE").exists()


@pytest.mark.parametrize(
    "algo, flags, message",
    [
        ("dqn", ["--env", "Pendulum-v1"], "needs a discrete action space"),
        ("drqn", ["--env", "Pendulum-v1"], "needs a discrete action space"),
        ("ppo", ["--env", "NoSuchEnv-v0"], "unknown env id"),
        ("dqn", ["--env-id", "NoSuchEnv-v0"], "unknown env id"),
        ("drqn", ["--eval-checkpoint", "/no/such/file.pt"], "does not exist"),
    ],
)
def test_bad_input_fails_with_one_clear_error(algo, flags, message, capsys):
    code, _, stderr = run_inline(capsys, algo, *flags, check=False)
    assert code == 2 and "Traceback" not in stderr
    assert stderr.startswith("error:") and len(stderr.strip().splitlines()) == 1, stderr
    assert message.lower() in stderr.lower(), stderr


def test_dqn_on_a_continuous_env_fails_in_a_fresh_interpreter():
    proc = run("dqn", "--env", "Pendulum-v1", check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert re.fullmatch(r"error: .*discrete.*\n", proc.stderr), proc.stderr


def test_corrupt_foreign_or_mismatched_checkpoint_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint at all")
    code, _, stderr = run_inline(capsys, "dqn", "--eval-checkpoint", bad, check=False)
    assert code == 2 and "unreadable" in stderr and "Traceback" not in stderr
    foreign = tmp_path / "foreign.pt"
    torch.save({"algo": "dqn", "env_id": "CartPole-v1"}, foreign)
    code, _, stderr = run_inline(capsys, "ppo", "--eval-checkpoint", foreign, check=False)
    assert code == 2 and "not a ppo checkpoint" in stderr
    other_env = tmp_path / "other_env.pt"
    torch.save({"algo": "drqn", "env_id": "Acrobot-v1", "signature": {"obs_shape": [6], "n_actions": 3}}, other_env)
    code, _, stderr = run_inline(capsys, "drqn", "--eval-checkpoint", other_env, check=False)
    assert code == 2 and "is malformed: it lacks" in stderr


@pytest.mark.parametrize("algo", ["ppo", "dqn", "drqn"])
def test_resume_keeps_the_best_checkpoint_of_before(algo, tmp_path, capsys, resume_keeps_best):
    """Checkpoints carry the best evaluation so far, so a resumed run replaces best.pt only with a better one."""
    n = STEPS[algo]
    go = lambda steps, *flags: run_inline(capsys, algo, "--total-timesteps", steps, "--eval-interval", n // 2, *flags)  # noqa: E731
    resume_keeps_best(tmp_path, lambda: go(n, "--run-dir", tmp_path), lambda: go(2 * n, "--resume", tmp_path), scalars)


def test_ppo_nan_loss_keeps_the_last_sound_checkpoint_and_resumes_with_a_lower_learning_rate(tmp_path, capsys):
    flags = ["--total-timesteps", STEPS["ppo"], "--eval-interval", 0, "--eval-episodes", 1]
    code, _, stderr = run_inline(capsys, "ppo", *flags, "--learning-rate", 1e30, "--run-dir", tmp_path, check=False)
    assert code == 2 and "Traceback" not in stderr
    last_line = stderr.strip().splitlines()[-1]
    assert re.match(r"error: the loss became (nan|-?inf) .*last.pt holds step 0", last_line), last_line
    ckpt = torch.load(tmp_path / "last.pt", weights_only=True)
    # the first update diverged within its epochs: last.pt holds the initial weights and untouched Adam moments
    assert ckpt["counters"] == {} and ckpt["global_step"] == 0 and ckpt["optimizers"]["agent"]["state"] == {}
    assert max(v.float().abs().max().item() for v in ckpt["nets"]["agent"].values()) < 10
    run_inline(capsys, "ppo", *flags, "--learning-rate", 2.5e-4, "--resume", tmp_path)
    assert torch.load(tmp_path / "last.pt", weights_only=True)["global_step"] == STEPS["ppo"]
