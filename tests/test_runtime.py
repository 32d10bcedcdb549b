"""The run-time layer (runtime/), tested once for every script: checkpoints, run dirs, stops, checks, evaluation.

End-to-end cases drive algos/mappo.py (the layer's first user) as a subprocess with tiny budgets; the rest call the
layer directly.
"""

import dataclasses
import errno
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath
from unittest import mock

import numpy as np
import pytest
import script_runs
import torch
import torch.nn as nn
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from buffers import ReplayBuffer
from runtime import ArgumentError, CheckpointError, check_args, load_checkpoint, periodic_seed, save_checkpoint
from runtime.args import MultiAgentArgs, checkpoint_defaults, make_env
from runtime.checkpoint import write_whole
from runtime.evaluation import FINAL_SEED, evaluate

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--backend", "pettingzoo", "--num-envs", "2", "--num-steps", "25", "--eval-episodes", "2",
        "--update-epochs", "1", "--final-eval-episodes", "4"]  # fmt: skip


def mappo(*flags, check=True):
    """algos/mappo.py with the tiny flags, in this process (script_runs.run_captured); `start` gives a process."""
    return script_runs.run_captured(ROOT / "algos" / "mappo.py", *TINY, *flags, check=check)


def start(*flags):
    cmd = [sys.executable, str(ROOT / "algos" / "mappo.py"), *TINY, *map(str, flags)]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, timeout=120):
    deadline = time.time() + timeout
    while not condition():
        if time.time() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.2)


def error_line(proc):
    """The one line a failure prints: exit 2, no traceback."""
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [x for x in proc.stderr.strip().splitlines() if x.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-2000:]
    return lines[0]


def weights(path):
    return torch.load(path, weights_only=True)


# --- checkpoints ------------------------------------------------------------------------------------------------
def checkpoint(**overrides):
    net = torch.nn.Linear(3, 2)
    rng = {"torch": torch.get_rng_state(), "numpy": np.random.default_rng(0).bit_generator.state}
    ckpt = dict(algo="mappo", env_id="simple_spread_v3", signature={"agent": [3, [18], True, 5]},
                args={"hidden_size": 64}, global_step=10, evals=1, best_eval=-1.0, counters={"iteration": 1},
                nets={"net": net.state_dict()}, optimizers={}, rng=rng)  # fmt: skip
    return ckpt | overrides


ARGS = MultiAgentArgs(env_id="simple_spread_v3")
ARGS.hidden_size = 64


def test_checkpoint_round_trip_is_atomic_and_loads_with_weights_only(tmp_path):
    path = str(tmp_path / "last.pt")
    save_checkpoint(path, checkpoint())
    assert os.listdir(tmp_path) == ["last.pt"]  # no temporary file left
    ckpt = load_checkpoint(path, "mappo", ARGS, {"agent": [3, [18], True, 5]}, ("hidden_size",))
    assert ckpt["global_step"] == 10 and set(ckpt["nets"]["net"]) == {"weight", "bias"}


@pytest.mark.parametrize(
    "tamper, message",
    [
        (lambda p: Path(p).write_bytes(b"not a checkpoint"), "is unreadable"),
        (lambda p: torch.save([1, 2], p), "not a checkpoint of these scripts"),
        (lambda p: torch.save(checkpoint(algo="maddpg"), p), "is not a mappo checkpoint"),
        (lambda p: torch.save({k: v for k, v in checkpoint().items() if k != "nets"}, p), r"lacks \['nets'\]"),
        (lambda p: torch.save(checkpoint(env_id="simple_tag_v3"), p), "was trained on simple_tag_v3"),
        (lambda p: torch.save(checkpoint(args={"hidden_size": 32}), p), "--hidden-size 32 .checkpoint. vs 64"),
        (lambda p: torch.save(checkpoint(nets={"net": {"weight": torch.tensor([np.nan])}}), p), "non-finite weights"),
        (lambda p: Path(p).unlink(), "does not exist"),
        # a foreign object: the unpickler's complaint alone, not torch's advice to load with weights_only=False
        (lambda p: torch.save({"a": PurePosixPath("x")}, p), r"refused it \(Unsupported global: GLOBAL pathlib\."),
        (lambda p: Path(p).write_bytes(b""), "the file ends early"),
        (lambda p: (Path(p).unlink(), Path(p).mkdir()), "a folder, not a checkpoint file: name one in it"),
    ],
)
def test_a_tampered_foreign_or_nan_checkpoint_gives_one_clear_error(tmp_path, tamper, message):
    path = str(tmp_path / "last.pt")
    save_checkpoint(path, checkpoint())
    tamper(path)
    with pytest.raises(CheckpointError, match=message) as e:
        load_checkpoint(path, "mappo", ARGS, {"agent": [3, [18], True, 5]}, ("hidden_size",))
    assert "\n" not in str(e.value) and "weights_only" not in str(e.value)


def test_another_scripts_checkpoint_is_refused_naming_its_script_before_its_flags_build_anything(tmp_path):
    """dqn.py --eval-checkpoint <a mappo checkpoint> took the checkpoint's env as its own and said "a multi-agent env
    of envs.make, not a Gymnasium id" instead of whose checkpoint it was."""
    path = str(tmp_path / "last.pt")
    save_checkpoint(path, checkpoint(args={"total_timesteps": 1234, "env_id": "simple_spread_v3"}))
    with pytest.raises(CheckpointError, match=rf"^checkpoint {re.escape(path)} is not a dqn checkpoint but a mappo "
                                              r"one: play it with algos/mappo\.py$"):  # fmt: skip
        checkpoint_defaults(MultiAgentArgs, ["--eval-checkpoint", path], "dqn")
    with pytest.raises(CheckpointError, match=r"not a qmix checkpoint but a mappo one: continue it with algos/mappo"):
        checkpoint_defaults(MultiAgentArgs, ["--resume", str(tmp_path)], "qmix")
    assert checkpoint_defaults(MultiAgentArgs, ["--eval-checkpoint", path], "mappo").total_timesteps == 1234  # its own


def test_a_checkpoint_of_other_env_flags_names_them_not_the_spaces(tmp_path):
    """--eval-checkpoint with --continuous-actions or another --env-kwargs than the run's was told "spaces {'agent': [3,
    [18], True, 5], ...} do not match ... {'agent': [3, [18], False, 5], ...}"."""
    path = str(tmp_path / "last.pt")
    save_checkpoint(path, checkpoint(args={"hidden_size": 64, "env_kwargs": '{"N": 4}', "continuous_actions": False}))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path, "mappo", ARGS, {"agent": [3, [18], True, 5], "state_shape": [54]}, ("hidden_size",))
    assert str(e.value) == (f"checkpoint {path} was trained on simple_spread_v3 with other env flags: --env-kwargs "
                            """'{"N": 4}' (checkpoint) vs '{}' (now): pass the checkpoint's values""")  # fmt: skip
    save_checkpoint(path, checkpoint(args={"hidden_size": 64, "env_kwargs": "{}"}))  # the same flags: the spaces said
    with pytest.raises(CheckpointError, match=r"with spaces .* which do not match simple_spread_v3 with"):
        load_checkpoint(path, "mappo", ARGS, {"agent": [3, [18], True, 5], "state_shape": [54]}, ("hidden_size",))


def test_a_package_id_is_named_as_ours_even_once_the_package_registered_it_in_gymnasium():
    """In CI's order lbforaging was imported first, its ids in Gymnasium's registry: the LBF key was called "a
    single-agent Gymnasium id"."""
    import gymnasium
    import lbforaging  # noqa: F401  (registers Foraging-...-v3 in Gymnasium)

    assert "Foraging-8x8-2p-2f-coop-v3" in gymnasium.registry
    with pytest.raises(ValueError, match="names the task without its version: 'Foraging-8x8-2p-2f-coop'"):
        make_env(MultiAgentArgs(env_id="Foraging-8x8-2p-2f-coop-v3"), 1, 0)
    with pytest.raises(ValueError, match="'CartPole-v1' is a single-agent Gymnasium id: train it with algos/ppo.py"):
        make_env(MultiAgentArgs(env_id="CartPole-v1"), 1, 0)


def test_non_finite_weights_are_never_written(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint(str(path), checkpoint())
    before = path.read_bytes()
    with pytest.raises(FloatingPointError, match="not finite"):
        save_checkpoint(str(path), checkpoint(nets={"net": {"weight": torch.tensor([np.inf])}}))
    assert path.read_bytes() == before


def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint(str(path), checkpoint())
    before = path.read_bytes()
    with mock.patch("torch.save", side_effect=OSError(errno.ENOSPC, "No space left on device")):
        with pytest.raises(OSError, match=r"could not write .*\(No space left on device\).* is intact"):
            save_checkpoint(str(path), checkpoint(global_step=20))
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["last.pt"]


def test_a_full_disk_keeps_the_previous_replay_snapshot_and_a_killed_write_is_replaced(tmp_path):
    path = str(tmp_path / "replay.npz")
    rb = ReplayBuffer(4, 2, {"obs": ((3,), np.float32)})
    rb.add(obs=np.ones((2, 3), np.float32))
    write_whole(path, rb.save)
    before = Path(path).read_bytes()
    rb.add(obs=np.zeros((2, 3), np.float32))
    with mock.patch("numpy.savez", side_effect=OSError(errno.ENOSPC, "No space left on device")):
        with pytest.raises(OSError, match=r"could not write .*replay.npz \(No space left on device\).* is intact"):
            write_whole(path, rb.save)
    assert Path(path).read_bytes() == before and os.listdir(tmp_path) == ["replay.npz"]
    Path(path + ".tmp").write_bytes(b"half")  # as a kill during a write leaves it
    write_whole(path, rb.save)
    back = ReplayBuffer(4, 2, {"obs": ((3,), np.float32)})
    back.load(path)
    assert os.listdir(tmp_path) == ["replay.npz"] and len(back) == 4 and (back.data["obs"] == rb.data["obs"]).all()


def test_a_signal_during_a_save_waits_until_the_file_is_in_place(tmp_path):
    path, seen = tmp_path / "last.pt", []
    real_save = torch.save

    def save_and_signal(obj, f):
        os.kill(os.getpid(), signal.SIGINT)  # arrives mid-write
        real_save(obj, f)

    previous = signal.signal(signal.SIGINT, lambda *_: seen.append(path.exists()))
    try:
        with mock.patch("torch.save", save_and_signal):
            save_checkpoint(str(path), checkpoint())
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [True]  # delivered once, after the rename
    assert weights(path)["global_step"] == 10


# --- argument checks ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Flags(MultiAgentArgs):
    num_steps: int = 25
    learning_rate: float = 1e-3
    gamma: float = 0.99
    batch_size: int = 32
    buffer_size: int = 100


@pytest.mark.parametrize(
    "change, message",
    [
        ({"total_timesteps": 0}, "--total-timesteps 0 must be a positive integer"),
        ({"total_timesteps": -5}, "--total-timesteps -5 must be a positive integer"),
        ({"num_envs": 0}, "--num-envs 0 must be a positive integer"),
        ({"num_steps": 0}, "--num-steps 0 must be a positive integer"),
        ({"eval_episodes": 0}, "--eval-episodes 0 must be a positive integer"),
        ({"eval_interval": -1}, "--eval-interval -1 must be >= 0"),
        ({"final_eval_episodes": -1}, "--final-eval-episodes -1 must be >= 0"),
        ({"seed": -1}, "--seed -1 must be >= 0"),
        ({"learning_rate": 0.0}, "--learning-rate 0.0 must be > 0"),
        ({"learning_rate": float("nan")}, "--learning-rate nan is not a finite number"),
        ({"gamma": 1.5}, r"--gamma 1.5 must lie in \[0, 1\]"),
        ({"checkpoint_minutes": 0.0}, "--checkpoint-minutes 0.0 must be > 0"),
        ({"batch_size": 200}, "--batch-size 200 exceeds --buffer-size 100"),
        ({"env_kwargs": "{bad"}, "--env-kwargs is not valid JSON"),
        ({"env_kwargs": "[1, 2]"}, "--env-kwargs must be a JSON object"),
        ({"backend": "jax"}, "--backend 'jax' is not one of"),
        ({"vector": "threads"}, "--vector 'threads' is not one of"),
        ({"eval_checkpoint": "/no/such.pt"}, "--eval-checkpoint /no/such.pt: checkpoint does not exist"),
        ({"eval_checkpoint": "/"}, "--eval-checkpoint /: a folder, not a checkpoint file: name one in it"),
        ({"resume": "a", "run_dir": "b"}, "--resume continues in its own directory"),
    ],
)
def test_every_bad_argument_is_refused_naming_the_flag(change, message):
    with pytest.raises(ArgumentError, match=message):
        check_args(dataclasses.replace(Flags(), **change))


def test_an_env_flag_and_env_kwargs_that_disagree_are_refused_not_settled_by_the_flag():
    """--max-cycles 5 --env-kwargs '{"max_cycles": 7}' ran 5-step episodes without a word."""
    from runtime.args import env_kwargs

    with pytest.raises(ValueError, match=r"^--max-cycles 5 and --env-kwargs' max_cycles 7 disagree: give it once$"):
        env_kwargs(dataclasses.replace(Flags(), max_cycles=5, env_kwargs='{"max_cycles": 7}'))
    agreed = dataclasses.replace(Flags(), max_cycles=7, map_size=None, env_kwargs='{"max_cycles": 7, "N": 4}')
    assert env_kwargs(agreed) == {"max_cycles": 7, "N": 4}


def test_cuda_without_a_device_and_track_without_wandb_are_refused():
    with mock.patch("torch.cuda.is_available", return_value=False):
        with pytest.raises(ArgumentError, match="--cuda was given but no CUDA device is available: drop --cuda"):
            check_args(Flags(cuda=True))
    with mock.patch("importlib.util.find_spec", return_value=None):
        with pytest.raises(ArgumentError, match="--track logs to Weights & Biases, which is not installed"):
            check_args(Flags(track=True))


def test_script_rules_and_good_arguments():
    check_args(Flags())  # the defaults pass
    with pytest.raises(ArgumentError, match="my rule"):
        check_args(Flags(), (True, "fine"), (False, "my rule"))


def test_a_bad_argument_is_refused_before_any_work(tmp_path):
    proc = mappo("--total-timesteps", 0, "--run-dir", tmp_path / "run", check=False)
    assert error_line(proc) == "error: --total-timesteps 0 must be a positive integer"
    assert not (tmp_path / "run").exists()


# --- run directories ----------------------------------------------------------------------------------------------
def test_a_locked_or_used_run_dir_is_refused(tmp_path):
    proc = start("--total-timesteps", 10_000_000, "--run-dir", tmp_path)
    try:
        wait_for(lambda: (tmp_path / "last.pt").exists())
        second = mappo("--total-timesteps", 100, "--run-dir", tmp_path, check=False)
        assert f"{tmp_path} is in use by another run (pid {proc.pid})" in error_line(second)
        resumed = mappo("--resume", tmp_path, check=False)
        assert "in use by another run" in error_line(resumed)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
    assert proc.returncode == 130
    # the run is over, but its directory holds it: a new run there is refused, --resume is the way on
    before = (tmp_path / "last.pt").read_bytes()
    again = mappo("--total-timesteps", 100, "--run-dir", tmp_path, check=False)
    assert "already holds a run" in error_line(again) and f"--resume {tmp_path}" in error_line(again)
    assert (tmp_path / "last.pt").read_bytes() == before


def test_kill_9_loses_at_most_one_checkpoint_interval_and_resume_finishes(tmp_path):
    interval = 0.02  # minutes: last.pt every 1.2 s
    proc = start("--total-timesteps", 10_000_000, "--eval-interval", 0, "--checkpoint-minutes", interval,
                 "--run-dir", tmp_path)  # fmt: skip
    wait_for(lambda: (tmp_path / "last.pt").exists() and weights(tmp_path / "last.pt")["global_step"] >= 500)
    time.sleep(2.5)
    proc.kill()  # SIGKILL: no handler runs
    proc.communicate(timeout=60)
    killed_at = time.time()
    assert killed_at - (tmp_path / "last.pt").stat().st_mtime < 60 * interval + 1.0
    step = weights(tmp_path / "last.pt")["global_step"]
    assert step >= 500
    (tmp_path / "last.pt.tmp").write_bytes(b"half")  # as a kill during a write leaves it (CI once caught one)
    # --resume alone continues the same run: its flags (budget included) come from last.pt
    out = mappo("--resume", tmp_path, "--total-timesteps", step + 100).stdout
    assert "resumed with other flags: --total-timesteps" in out
    assert weights(tmp_path / "last.pt")["global_step"] == step + 100 and (tmp_path / "DONE").exists()
    assert not list(tmp_path.glob("*.tmp"))  # the resumed run's own writes replaced the half-written file


def test_resume_takes_the_checkpoints_flags_and_refuses_another_num_envs(tmp_path):
    mappo("--total-timesteps", 100, "--eval-interval", 0, "--hidden-size", 16, "--run-dir", tmp_path)
    assert mappo("--resume", tmp_path).returncode == 0  # nothing left to train: hidden size and budget kept
    assert weights(tmp_path / "last.pt")["args"]["total_timesteps"] == 100
    proc = mappo("--resume", tmp_path, "--num-envs", 4, check=False)
    assert "--num-envs 2 (checkpoint) vs 4 (now)" in error_line(proc)
    proc = mappo("--resume", tmp_path, "--hidden-size", 32, check=False)
    assert "--hidden-size 16 (checkpoint) vs 32 (now)" in error_line(proc)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_a_diverging_run_leaves_a_finite_last_checkpoint_that_resumes(tmp_path):
    proc = mappo("--total-timesteps", 2000, "--learning-rate", 1e6, "--run-dir", tmp_path, check=False)
    line = error_line(proc)
    assert "the loss became" in line and f"--resume {tmp_path} and a lower learning rate" in line
    last = weights(tmp_path / "last.pt")
    assert all(torch.isfinite(v).all() for sd in last["nets"].values() for v in sd.values() if v.is_floating_point())
    mappo("--resume", tmp_path, "--learning-rate", 1e-4)
    assert (tmp_path / "DONE").exists() and weights(tmp_path / "last.pt")["global_step"] == 2000


# --- evaluation protocol v2 --------------------------------------------------------------------------------------
def test_periodic_evaluations_never_replay_a_start_and_seeds_never_share_one():
    starts = [periodic_seed(s, k, 10) + i for s in range(50) for k in range(100) for i in range(10)]
    assert len(set(starts)) == len(starts)
    assert not set(starts) & set(range(FINAL_SEED, FINAL_SEED + 1000))


def test_evaluation_episodes_do_not_depend_on_the_batching():
    args = MultiAgentArgs(env_id="simple_spread_v3", backend="pettingzoo")
    make = lambda n, seed: make_env(args, n, seed, "pettingzoo", "sync")  # noqa: E731

    def make_greedy(n, rng):  # a fixed deterministic policy of the observation
        return lambda obs, done: {"agent": (np.abs(obs.obs["agent"]).sum(-1) * 7).astype(np.int64) % 5}

    full, groups = evaluate(make, make_greedy, 6, FINAL_SEED)
    with mock.patch("runtime.evaluation.BATCH", 4):
        batched, _ = evaluate(make, make_greedy, 6, FINAL_SEED)
    assert full.shape == (6,) and np.array_equal(full, batched) and groups["agent"].shape == (6,)
    other, _ = evaluate(make, make_greedy, 6, periodic_seed(0, 0, 6))
    assert not np.array_equal(full, other)


def test_final_evaluation_is_written_and_eval_checkpoint_replays_it(tmp_path):
    mappo("--total-timesteps", 100, "--eval-interval", 50, "--capture-video", "--run-dir", tmp_path)
    assert sorted(p.name for p in (tmp_path / "videos").iterdir()) == ["step_100.mp4", "step_50.mp4"]
    acc = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    acc.Reload()
    assert [e.step for e in acc.Images("eval/video")] == [50, 100]  # the videos in TensorBoard, as GIFs
    assert [e.step for e in acc.Scalars("charts/SPS")] == [50, 100]  # counted to the step just taken, not the last
    assert min(e.value for e in acc.Scalars("charts/SPS")) > 0  # run.step() call's (0 at the first iteration)
    final = json.loads((tmp_path / "final_eval.json").read_text())
    assert final["protocol"] == "v2" and final["seed"] == FINAL_SEED and final["episodes"] == 4
    assert len(final["returns"]) == 4 and final["mean"] == pytest.approx(np.mean(final["returns"]), abs=1e-3)
    out = mappo("--eval-checkpoint", tmp_path / "last.pt").stdout  # --eval-episodes 2: the first two of the set
    assert f"episodic return {np.mean(final['returns'][:2]):.2f}" in out


def test_a_flag_for_the_other_kind_of_actions_is_refused():
    from runtime import check_action_flags

    @dataclasses.dataclass
    class DDPGFlags(MultiAgentArgs):
        exploration_noise: float = 0.1
        gumbel_temperature: float = 1.0

    discrete = make_env(MultiAgentArgs(), 1, 0, "numba", "sync")
    continuous = make_env(MultiAgentArgs(continuous_actions=True), 1, 0, "numba", "sync")
    check_action_flags(DDPGFlags(), discrete, ("exploration_noise",), ("gumbel_temperature",))  # defaults: fine
    with pytest.raises(ArgumentError, match="--exploration-noise applies to continuous actions only"):
        check_action_flags(DDPGFlags(exploration_noise=0.3), discrete, ("exploration_noise",))
    with pytest.raises(ArgumentError, match="--gumbel-temperature applies to discrete actions only"):
        check_action_flags(DDPGFlags(gumbel_temperature=0.5), continuous, (), ("gumbel_temperature",))


def test_restore_takes_the_moments_from_the_checkpoint_and_the_learning_rate_from_the_flags(tmp_path):
    from runtime import restore

    net = torch.nn.Linear(3, 2)
    diverging = torch.optim.Adam(net.parameters(), lr=1e30)
    net(torch.ones(1, 3)).sum().backward()
    diverging.step()
    ckpt = checkpoint(nets={"net": net.state_dict()}, optimizers={"opt": diverging.state_dict()})
    lower = torch.optim.Adam(net.parameters(), lr=1e-3)
    restore(ckpt, "last.pt", {"net": net}, {"opt": lower})
    assert lower.param_groups[0]["lr"] == 1e-3  # --resume --learning-rate <lower> is obeyed
    assert all(int(s["step"]) == 1 for s in lower.state.values())  # the Adam moments came back
    with pytest.raises(CheckpointError, match="other networks or states"):
        restore(ckpt, "last.pt", {"net": torch.nn.Linear(4, 2)})


# --- optim: the guarded step of the off-policy actor-critics ---------------------------------------------------------


class Stacked(torch.nn.Module):
    """n agents' linear maps stacked on the first dim, as runtime's GroupLinear holds them."""

    def __init__(self, n, d_in, d_out):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, d_in, d_out))
        self.bias = torch.nn.Parameter(torch.randn(n, 1, d_out))

    def forward(self, x):
        return torch.baddbmm(self.bias, x, self.weight)


def test_group_linear_sends_stack_k_through_layer_k_and_takes_the_first_stacks_alone():
    from runtime import GroupLinear

    layer = GroupLinear(3, 4, 2)
    assert not layer.weight.any() and not layer.bias.any()  # zero until a script's layer_init draws them
    torch.nn.init.normal_(layer.weight), torch.nn.init.normal_(layer.bias)
    x = torch.randn(3, 5, 4)
    want = torch.stack([x[k] @ layer.weight[k] + layer.bias[k] for k in range(3)])
    torch.testing.assert_close(layer(x), want)
    torch.testing.assert_close(layer(x[:2]), want[:2])  # matd3: the first of the twin critics alone


def test_optimize_clips_every_agent_as_its_own_clip_grad_norm_would():
    from runtime import optimize

    torch.manual_seed(0)
    net = Stacked(3, 4, 2)
    x = torch.randn(3, 5, 4) * torch.tensor([0.01, 1.0, 100.0]).view(3, 1, 1)  # agent 0 under the limit, 1-2 over
    reference = [Stacked(1, 4, 2) for _ in range(3)]  # one network per agent, each its own clip_grad_norm_
    for k, ref in enumerate(reference):
        ref.weight = torch.nn.Parameter(net.weight[k : k + 1].detach().clone())
        ref.bias = torch.nn.Parameter(net.bias[k : k + 1].detach().clone())
        ref(x[k : k + 1]).square().sum().backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
    optimizer = torch.optim.SGD(net.parameters(), lr=1.0)
    before = net.weight.detach().clone()
    optimize(net(x).square().sum(), optimizer, [net], 0.5, "critic")
    for k, ref in enumerate(reference):
        torch.testing.assert_close(before[k] - net.weight.detach()[k], ref.weight.grad[0])
    norms = [torch.cat([r.weight.grad.flatten(), r.bias.grad.flatten()]).norm().item() for r in reference]
    assert norms[0] < 0.5 and norms[1] == pytest.approx(0.5, rel=1e-4) and norms[2] == pytest.approx(0.5, rel=1e-4)


def test_optimize_refuses_a_non_finite_loss_and_leaves_the_weights():
    from runtime import optimize

    net = Stacked(2, 3, 1)
    before = [p.detach().clone() for p in net.parameters()]
    loss = net(torch.randn(2, 4, 3)).sum() * float("nan")
    with pytest.raises(FloatingPointError, match=r"the actor loss became nan; lower --actor-lr"):
        optimize(loss, torch.optim.Adam(net.parameters()), [net], 0.5, "actor")
    assert all(torch.equal(b, p) for b, p in zip(before, net.parameters(), strict=True))


def test_check_finite_names_the_loss_its_terms_and_the_advice():
    from runtime import check_finite

    check_finite(torch.tensor(1.5), "the loss", "lower --learning-rate", policy=torch.tensor(float("nan")))  # finite
    with pytest.raises(FloatingPointError, match=r"^the loss became inf \(policy 0\.123, value inf\); lower --lr$"):
        check_finite(
            torch.tensor(float("inf")),
            "the loss",
            "lower --lr",
            policy=torch.tensor(0.1234),
            value=torch.tensor(float("inf")),
        )
    with pytest.raises(FloatingPointError, match=r"^group red: the TD loss became nan; check the rewards$"):
        check_finite(torch.tensor(float("nan")), "group red: the TD loss", "check the rewards")


def test_soft_update_moves_targets_tau_of_the_way_for_a_module_or_a_sequence():
    from runtime import soft_update

    sources, targets = [Stacked(2, 3, 1), Stacked(1, 2, 2)], [Stacked(2, 3, 1), Stacked(1, 2, 2)]
    expected = [t.detach() + 0.1 * (s.detach() - t.detach()) for T, S in zip(targets, sources, strict=True)
                for t, s in zip(T.parameters(), S.parameters(), strict=True)]  # fmt: skip
    soft_update(targets, sources, 0.1)
    for e, p in zip(expected, [p for T in targets for p in T.parameters()], strict=True):
        torch.testing.assert_close(p.detach(), e)
    one, other = Stacked(2, 3, 1), Stacked(2, 3, 1)
    soft_update(one, other, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(one.parameters(), other.parameters(), strict=True))


def test_soft_update_copies_buffers_so_a_targets_running_statistics_stay_its_sources():
    """A qmix-like team with --standardise-rewards' RunningNorm: after a few updates of the source's statistics and
    one soft update, the target's moments are the source's (they had stayed at the deepcopy's before the copy)."""
    import copy

    from runtime import RunningNorm, soft_update

    team = nn.ModuleDict({"q": Stacked(2, 3, 1), "reward_norm": RunningNorm()})
    target = copy.deepcopy(team)
    for _ in range(3):
        team["reward_norm"].update(torch.randn(50) * 3 + 1)
    soft_update(target, team, 0.5)
    for name, buffer in team.named_buffers():
        assert torch.equal(dict(target.named_buffers())[name], buffer), name
    assert float(target["reward_norm"].count) > 150


@pytest.mark.parametrize("shape", [(), (3,)])
def test_running_norm_merges_batches_into_the_moments_of_their_concatenation(shape):
    """value targets (shape ()) and per-feature inputs ((3,)): batches of different sizes and offsets, merged one by
    one, give numpy's mean and variance over all samples; normalize and denormalize are inverse."""
    from runtime import RunningNorm

    rng = np.random.default_rng(0)
    moments = ((5.0, 0.1, 7), (-2.0, 3.0, 200), (0.0, 1.0, 1))
    batches = [rng.normal(loc, scale, (n, *shape)) for loc, scale, n in moments]
    norm = RunningNorm(shape)
    for b in batches:
        norm.update(torch.as_tensor(b))  # float64 in: the moments stay float32
    every = np.concatenate(batches)
    assert norm.mean.dtype == torch.float32 and norm.count.item() == pytest.approx(len(every), abs=1e-3)
    np.testing.assert_allclose(norm.mean.numpy(), every.mean(0), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(norm.var.numpy(), every.var(0), rtol=1e-4, atol=1e-4)
    x = torch.randn(4, *shape)
    torch.testing.assert_close(norm.denormalize(norm.normalize(x)), x)
    far = norm.mean + 100 * torch.sqrt(norm.var)  # 100 std away: clipped to 10 with clip=10, else not
    assert torch.all(norm.normalize(far, clip=10.0) == 10.0) and torch.all(norm.normalize(far) > 99)


def test_input_norm_counts_only_the_alive_samples_and_off_is_the_identity_with_nothing_to_save():
    """--feature-norm running: InputNorm's moments are those of the alive samples alone, its output clipped to
    +-INPUT_CLIP; off, a network's inputs pass unchanged and its state dict is what it was without the module."""
    from runtime import INPUT_CLIP, InputNorm

    rng = np.random.default_rng(0)
    x, alive = rng.normal(3.0, 2.0, (50, 4, 6)).astype(np.float32), rng.random((50, 4)) < 0.7
    x[~alive] = 1e6  # a dead agent's padding: counted, it would wreck the moments
    norm = InputNorm(6)
    norm.update(x, alive=alive)
    np.testing.assert_allclose(norm.mean.numpy(), x[alive].mean(0), rtol=1e-5)
    np.testing.assert_allclose(norm.var.numpy(), x[alive].var(0), rtol=1e-4)
    assert norm(torch.as_tensor(x)).abs().max() == INPUT_CLIP  # the padding, 1e6 away, is clipped
    off = InputNorm(6, on=False)
    off.update(x, alive=alive)
    inputs = torch.as_tensor(x)
    assert off(inputs) is inputs and off.state_dict() == {}


def test_categorical_equals_torchs_and_samples_its_probabilities():
    """runtime.Categorical (log-softmax along the first axis, Gumbel-max sampling) against
    torch.distributions.Categorical: log-probs, entropy, mode and their gradients; sampled frequencies within 4
    standard errors of the probabilities; an unavailable action is never drawn and adds nothing to the entropy."""
    from runtime import Categorical

    torch.manual_seed(0)
    logits = torch.randn(64, 3, 5, requires_grad=True)
    avail = torch.rand(64, 3, 5) < 0.6
    avail[..., 2] = True
    actions = torch.where(avail, torch.rand(64, 3, 5), -1.0).argmax(-1)  # an available action per row
    ours = Categorical(logits, avail)
    theirs = torch.distributions.Categorical(logits=logits.masked_fill(~avail, -1e9), validate_args=False)
    assert torch.equal(ours.mode, theirs.probs.argmax(-1))
    for a, b in ((ours.log_prob(actions), theirs.log_prob(actions)), (ours.entropy(), theirs.entropy())):
        torch.testing.assert_close(a, b)
        ga, gb = (torch.autograd.grad(x.sin().sum(), logits, retain_graph=True)[0] for x in (a, b))
        torch.testing.assert_close(ga, gb)
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    n = 200_000
    draws = Categorical(probs.log().expand(n, 5), (probs > 0).expand(n, 5)).sample()
    freq = torch.bincount(draws, minlength=5).double() / n
    assert freq[4] == 0
    assert ((freq - probs).abs() <= 4 * (probs * (1 - probs) / n).sqrt() + 1e-12).all(), freq


def test_clip_grad_norm_equals_torchs():
    from runtime import clip_grad_norm

    for max_norm in (0.1, 1e3):  # clipped, and left alone
        torch.manual_seed(0)
        params = [torch.randn(s, requires_grad=True) for s in ((3, 4, 5), (3, 1, 5), (7,))]
        copies = [p.detach().clone().requires_grad_() for p in params]
        for p, c in zip(params, copies, strict=True):
            p.grad = torch.randn_like(p)
            c.grad = p.grad.clone()
        ours, theirs = clip_grad_norm(params, max_norm), nn.utils.clip_grad_norm_(copies, max_norm)
        torch.testing.assert_close(ours, theirs)
        for p, c in zip(params, copies, strict=True):
            torch.testing.assert_close(p.grad, c.grad)


def test_adam_is_fused_where_torch_has_it_and_says_so_once_where_not(monkeypatch, capsys):
    """Fused Adam takes the same steps as the per-tensor loop; without it, one notice, then the foreach form."""
    import runtime.optim as optim

    weights = []
    for make in (lambda ps: optim.adam(ps, 1e-2, eps=1e-5), lambda ps: torch.optim.Adam(ps, 1e-2, eps=1e-5,
                                                                                          foreach=False)):  # fmt: skip
        torch.manual_seed(0)
        net = nn.Linear(4, 3)
        opt = make(net.parameters())
        for _ in range(5):
            opt.zero_grad()
            net(torch.randn(8, 4)).square().sum().backward()
            opt.step()
        weights.append(net.weight.detach())
    assert opt.defaults["fused"] is not True and optim.adam([torch.zeros(1, requires_grad=True)], 1e-3).defaults[
        "fused"] is optim.FUSED_ADAM  # fmt: skip
    torch.testing.assert_close(*weights)
    monkeypatch.setattr(optim, "FUSED_ADAM", False)
    monkeypatch.setattr(optim, "_told", False)
    for _ in range(2):
        opt = optim.adam([torch.zeros(1, requires_grad=True)], 1e-3)
    assert opt.defaults["foreach"] is True and not opt.defaults["fused"]
    assert capsys.readouterr().err.count("no fused Adam") == 1


FAULTS_PROBE = """
import resource
import torch
from runtime import keep_freed_memory
applied = keep_freed_memory()
def step():  # a 64 MB activation (MAgent2's battle makes larger ones): over glibc's largest mmap threshold, 32 MB
    return float(torch.ones(16_000_000)[0])
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc tunables: a no-op elsewhere")
def test_freed_memory_is_kept_for_reuse_instead_of_page_faulted_in_again():
    def probe(**env):
        out = subprocess.run([sys.executable, "-c", FAULTS_PROBE], capture_output=True, text=True, check=True,
                             cwd=ROOT, env=os.environ | env, timeout=120).stdout.split()  # fmt: skip
        return out[0] == "True", int(out[1])

    applied, kept = probe()
    skipped, default = probe(FLASHMARL_MALLOC="glibc")
    respected, _ = probe(MALLOC_TRIM_THRESHOLD_="131072")  # the user's own glibc tunables win
    tuned, _ = probe(GLIBC_TUNABLES="glibc.malloc.mmap_max=0")
    assert applied and not skipped and not respected and not tuned
    assert default > 100_000  # under glibc's defaults: mapped afresh each time, 64 MB of 4 kB pages faulted in
    assert kept < default / 100  # kept: the heap's block reused


def test_a_fresh_install_is_told_that_the_kernels_compile_once_and_a_warm_one_is_not(tmp_path, monkeypatch):
    from runtime.args import uncompiled_kernels

    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    for module in ("buffers", "envs/mpe"):
        (tmp_path / module / "__pycache__").mkdir(parents=True)
    assert uncompiled_kernels("simple_spread_v3", str(tmp_path)) == ["the buffers", "the MPE physics"]
    assert uncompiled_kernels("battle_v4", str(tmp_path)) == ["the buffers"]
    assert uncompiled_kernels("Foraging-5x5-2p-1f", str(tmp_path)) == ["the buffers", "the LBF port"]
    assert uncompiled_kernels("rware-tiny-2ag", str(tmp_path)) == ["the buffers", "the RWARE port"]
    (tmp_path / "envs" / "__pycache__").mkdir()
    (tmp_path / "envs" / "__pycache__" / "foraging_numba.step_envs-245.py311.nbi").touch()
    assert uncompiled_kernels("Foraging-5x5-2p-1f", str(tmp_path)) == ["the buffers"]
    (tmp_path / "buffers" / "__pycache__" / "kernels._gae-18.py311.nbi").touch()
    (tmp_path / "envs" / "mpe" / "__pycache__" / "kernels.step_envs-9.py311.nbi").touch()
    assert uncompiled_kernels("simple_spread_v3", str(tmp_path)) == []
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))  # a cache elsewhere: it cannot tell, so it says nothing
    (tmp_path / "buffers" / "__pycache__" / "kernels._gae-18.py311.nbi").unlink()
    assert uncompiled_kernels("simple_spread_v3", str(tmp_path)) == []


def test_a_stop_while_the_run_directory_is_made_leaves_one_to_resume_or_none(tmp_path, capsys, monkeypatch):
    """A Ctrl-C a few milliseconds after config.json appeared once left a directory that could be neither rerun
    ("already holds a run") nor resumed ("holds no last.pt"). From the moment Run takes the signals, a stop waits for
    the first run.step(); and last.pt is written before config.json, so a kill -9 between them leaves a run to
    resume, and one before them a directory that a rerun may take."""
    from script_runs import run_inline

    import runtime.run

    flags = ["--total-timesteps", 100, "--num-envs", 2, "--eval-interval", 0, "--final-eval-episodes", 0]
    real = runtime.run.Run.write_config

    def ctrl_c_then_write(self, env):  # Ctrl-C as config.json is written
        os.kill(os.getpid(), signal.SIGINT)
        real(self, env)

    monkeypatch.setattr(runtime.run.Run, "write_config", ctrl_c_then_write)
    code, stdout, _ = run_inline(capsys, "mappo", *flags, "--run-dir", tmp_path / "a", check=False)
    assert code == 130 and f"continue with --resume {tmp_path / 'a'}" in stdout
    monkeypatch.setattr(runtime.run.Run, "write_config", real)
    run_inline(capsys, "mappo", "--resume", tmp_path / "a")
    assert (tmp_path / "a" / "DONE").exists() and weights(tmp_path / "a" / "last.pt")["global_step"] == 100

    def killed(self, env):  # kill -9 after last.pt, before config.json: nothing else runs
        raise SystemExit(-9)

    monkeypatch.setattr(runtime.run.Run, "write_config", killed)
    run_inline(capsys, "mappo", *flags, "--run-dir", tmp_path / "b", check=False)
    monkeypatch.setattr(runtime.run.Run, "write_config", real)
    assert not (tmp_path / "b" / "config.json").exists()
    run_inline(capsys, "mappo", "--resume", tmp_path / "b")
    assert (tmp_path / "b" / "config.json").exists() and (tmp_path / "b" / "DONE").exists()


# every multi-agent script that hands the run its loop's state (algos/mfq.py: tests/test_results.py, through a sweep)
ON_POLICY, OFF_POLICY = ["--num-steps", 20], ["--learning-starts", 100, "--batch-size", 8, "--log-interval", 20]
EXACT_RESUME = {a: ON_POLICY + ["--update-epochs", 2] for a in ("mappo", "ippo", "happo", "vdac", "ic3net", "commnet",
                                                                 "tarmac")}  # fmt: skip
EXACT_RESUME |= {a: ON_POLICY for a in ("coma", "mfac")}
EXACT_RESUME |= {a: OFF_POLICY for a in ("maddpg", "matd3", "iddpg", "isac", "masac", "iql", "qmix", "vdn", "wqmix",
                                         "qtran", "dcg")}  # fmt: skip


def stop_at(monkeypatch, step):
    """Make runs stop from ``step`` on, as SIGTERM's handler would (mid-episode); returns the real ``Run.step``."""
    import runtime.run

    real = runtime.run.Run.step

    def step_then_stop(self, global_step, *a, **kw):
        if global_step >= step:
            self.stop_signal = signal.SIGTERM
        real(self, global_step, *a, **kw)

    monkeypatch.setattr(runtime.run.Run, "step", step_then_stop)
    return real


@pytest.mark.parametrize("algo", sorted(EXACT_RESUME))
def test_a_run_stopped_and_resumed_learns_bit_for_bit_as_one_never_stopped(algo, tmp_path, capsys, monkeypatch):
    """On the Numba MPE (an env that saves its state), a stop mid-episode and a --resume go on with the same episodes,
    transitions and updates: every loss logged after the resume, and the final weights, equal a run never stopped."""
    from script_runs import run_inline

    import runtime.run

    flags = ["--env-id", "simple_spread_v3", "--backend", "numba", "--num-envs", 2, "--total-timesteps", 600,
             "--eval-interval", 0, "--final-eval-episodes", 2, *EXACT_RESUME[algo]]  # fmt: skip
    run_inline(capsys, algo, *flags, "--run-dir", tmp_path / "ref")
    real = stop_at(monkeypatch, 310)  # mid-episode (25 steps, 2 envs)
    code, _, _ = run_inline(capsys, algo, *flags, "--run-dir", tmp_path / "run", check=False)
    monkeypatch.setattr(runtime.run.Run, "step", real)
    stop = weights(tmp_path / "run" / "last.pt")["global_step"]
    assert code == 130 and 310 <= stop < 600
    _, out, _ = run_inline(capsys, algo, "--resume", tmp_path / "run")
    assert "new episodes" not in out
    ref, resumed = weights(tmp_path / "ref" / "last.pt")["nets"], weights(tmp_path / "run" / "last.pt")["nets"]
    assert all(torch.equal(ref[n][k], resumed[n][k]) for n in ref for k in ref[n]), "final weights differ"
    logged = [EventAccumulator(str(d), size_guidance={"scalars": 0}) for d in (tmp_path / "ref", tmp_path / "run")]
    for acc in logged:
        acc.Reload()
    tags = [t for t in logged[0].Tags()["scalars"] if t.startswith("losses/")]
    assert tags
    for tag in tags:
        ref_after, run_after = ([(e.step, e.value) for e in acc.Scalars(tag) if e.step > stop] for acc in logged)
        assert ref_after and ref_after == run_after, tag


def test_a_full_disk_at_a_stop_loses_the_replay_buffer_but_not_the_weights(tmp_path, capsys, monkeypatch):
    """The replay buffer is the big file a stop writes (3 GB on rware-tiny-4ag): when it does not fit, last.pt
    is written all the same, and --resume refills the buffer and says so."""
    from script_runs import run_inline

    flags = ["--env-id", "simple_spread_v3", "--backend", "numba", "--num-envs", 2, "--total-timesteps", 400,
             "--eval-interval", 0, "--final-eval-episodes", 0, *OFF_POLICY, "--run-dir", tmp_path]  # fmt: skip
    stop_at(monkeypatch, 200)
    monkeypatch.setattr(np, "savez", mock.Mock(side_effect=OSError(errno.ENOSPC, "No space left on device")))
    code, out, err = run_inline(capsys, "iql", *flags, check=False)
    monkeypatch.undo()
    assert code == 130 and "Traceback" not in err, err[-2000:]
    assert re.search(r"could not write \S*replay.npz \(No space left on device\).*--resume refills the replay", out)
    assert weights(tmp_path / "last.pt")["global_step"] >= 200 and "replay_step" not in weights(tmp_path / "last.pt")
    assert not list(tmp_path.glob("replay.npz*"))
    _, out, _ = run_inline(capsys, "iql", "--resume", tmp_path)
    assert "replay.npz does not exist: the replay buffer refills from scratch" in out
    assert weights(tmp_path / "last.pt")["global_step"] == 400


def test_a_resume_that_cannot_restore_the_envs_says_they_start_new_episodes(tmp_path, capsys, monkeypatch):
    """PettingZoo's envs keep no state to save: the resumed run goes on from new episodes, and says so."""
    from script_runs import run_inline

    import runtime.run
    from envs import SyncVecEnv

    flags = ["--backend", "pettingzoo", "--num-envs", 2, "--num-steps", 25, "--total-timesteps", 200,
             "--eval-interval", 0, "--final-eval-episodes", 0, "--run-dir", tmp_path]  # fmt: skip
    real = stop_at(monkeypatch, 100)
    assert run_inline(capsys, "mappo", *flags, check=False)[0] == 130
    monkeypatch.setattr(runtime.run.Run, "step", real)
    seeds, reset = [], SyncVecEnv.reset
    monkeypatch.setattr(SyncVecEnv, "reset", lambda env, seed=None: seeds.append(seed) or reset(env, seed))
    _, out, _ = run_inline(capsys, "mappo", "--resume", tmp_path)
    assert "the envs start new episodes at step 100 (this env (SyncVecEnv) does not save its state)" in out
    # ... new ones, not the run's first episodes again (those of --seed 0): seeded from the seed and the step
    seed = weights(tmp_path / "last.pt")["args"]["seed"]
    assert runtime.run.resume_seed(seed, 100) in seeds and runtime.run.resume_seed(seed, 100) not in (seed, seed + 1)
    assert runtime.run.resume_seed(seed, 100) != runtime.run.resume_seed(seed, 200) != runtime.run.resume_seed(0, 200)
