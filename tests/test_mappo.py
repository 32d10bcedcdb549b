"""algos/mappo.py and algos/ippo.py end to end with tiny budgets: in this process (the same CLI and code path, no torch
import per run) unless a test needs a process of its own (signals, an environment variable read at import)."""

import json
import re
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import script_runs
import torch
from script_runs import scalars

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ["mappo", "ippo"]
TINY = ["--backend", "pettingzoo", "--num-envs", "2", "--eval-episodes", "2", "--update-epochs", "2",
        "--final-eval-episodes", "4"]  # fmt: skip


def run(algo, *flags, check=True, own_process=False):
    """algos/<algo>.py with the tiny flags, in this process (no torch import per run) unless it needs `own_process`
    (an environment variable read at import)."""
    script = ROOT / "algos" / f"{algo}.py"
    if not own_process:
        return script_runs.run_captured(script, *TINY, *flags, check=check)
    cmd = [sys.executable, str(script), *TINY, *map(str, flags)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def first_final_returns(run_dir, n=2):
    """The mean return of the first n episodes of the run's final evaluation (protocol v2's fixed episode set)."""
    return float(np.mean(json.loads((run_dir / "final_eval.json").read_text())["returns"][:n]))


def reloaded_return(algo, checkpoint, *flags):
    ev = run(algo, "--eval-checkpoint", checkpoint, *flags)  # --eval-episodes 2: the first two of the fixed set
    return float(re.search(r"episodic return (-?[\d.]+)", ev.stdout).group(1))


@pytest.mark.parametrize("algo", ALGOS)
def test_discrete_spread_writes_events_checkpoints_and_reloads_to_the_same_actions(algo, tmp_path):
    run(algo, "--total-timesteps", 200, "--eval-interval", 100, "--run-dir", tmp_path)
    for name in ("config.json", "last.pt", "best.pt", "final_eval.json", "DONE"):
        assert (tmp_path / name).exists(), name
    assert len(scalars(tmp_path, "eval/episodic_return")) == 2
    assert scalars(tmp_path, "losses/policy_loss") and scalars(tmp_path, "charts/SPS")
    ckpt = torch.load(tmp_path / "last.pt", weights_only=True)
    assert ckpt["global_step"] == 200 and ckpt["algo"] == algo
    # greedy evaluation of the reloaded checkpoint replays the run's final evaluation exactly
    assert reloaded_return(algo, tmp_path / "last.pt") == pytest.approx(first_final_returns(tmp_path), abs=0.01)


@pytest.mark.parametrize("algo", ALGOS)
def test_continuous_two_group_and_frozen_group_runs(algo, tmp_path):
    run(algo, "--continuous-actions", "--total-timesteps", 100, "--run-dir", tmp_path / "c")
    assert (tmp_path / "c" / "DONE").exists()
    run(algo, "--env", "simple_adversary_v3", "--total-timesteps", 100, "--run-dir", tmp_path / "a")
    assert scalars(tmp_path / "a", "losses/policy_loss/adversary") and scalars(
        tmp_path / "a", "losses/policy_loss/agent"
    )
    assert scalars(tmp_path / "a", "eval/episodic_return/adversary")
    flags = ["--env", "simple_adversary_v3", "--random-groups", "adversary", "--total-timesteps", 100]
    run(algo, *flags, "--run-dir", tmp_path / "f")
    assert not scalars(tmp_path / "f", "losses/policy_loss/adversary")  # the frozen group does not learn
    assert scalars(tmp_path / "f", "losses/policy_loss")


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["--continuous-actions"],
        ["--rnn", "--rnn-chunk", 5],
        ["--rnn", "--env", "simple_adversary_v3", "--continuous-actions"],
    ],
    ids=["ff", "cont", "rnn", "rnn2"],
)
def test_stored_log_probs_are_recomputed_exactly_before_the_first_step(algo, flags, tmp_path):
    """One epoch of one minibatch: the ratio is computed before any optimizer step, so it must be exactly 1.

    This catches a stored action that differs from the sampled one (a Gaussian sample clipped before its
    log-probability is recomputed) and, with --rnn, hidden states that differ between acting and training.
    """
    run(algo, *flags, "--update-epochs", 1, "--total-timesteps", 100, "--eval-interval", 0, "--run-dir", tmp_path)
    kl = [v for tag in ("losses/approx_kl", "losses/approx_kl/agent") for _, v in scalars(tmp_path, tag)]
    assert len(kl) == 2 and max(abs(v) for v in kl) < 1e-6, kl


@pytest.mark.parametrize("algo", ALGOS)
def test_rnn_checkpoint_reloads_to_the_same_actions(algo, tmp_path):
    run(algo, "--rnn", "--total-timesteps", 100, "--eval-interval", 0, "--run-dir", tmp_path)
    reloaded = reloaded_return(algo, tmp_path / "last.pt", "--rnn")
    assert reloaded == pytest.approx(first_final_returns(tmp_path), abs=0.01)
    # the network flags come from the checkpoint; a contradicting one is refused, naming it
    assert reloaded_return(algo, tmp_path / "last.pt") == pytest.approx(reloaded, abs=0.01)
    proc = run(algo, "--eval-checkpoint", tmp_path / "last.pt", "--no-rnn", check=False)
    assert proc.returncode == 2 and "--rnn True (checkpoint) vs False (now)" in proc.stderr


def test_battle_small_map_with_agent_deaths(tmp_path):
    flags = ["--env", "battle_v4", "--map-size", 12, "--max-cycles", 30, "--num-steps", 10, "--total-timesteps", 60]
    run("mappo", *flags, "--run-dir", tmp_path)
    assert (tmp_path / "DONE").exists()
    assert scalars(tmp_path, "losses/policy_loss/red") and scalars(tmp_path, "losses/policy_loss/blue")


@pytest.mark.parametrize("algo", ALGOS)
def test_same_seed_same_first_losses(algo, tmp_path):
    for name in ("a", "b"):
        run(algo, "--total-timesteps", 100, "--eval-interval", 0, "--seed", 3, "--run-dir", tmp_path / name)
    for tag in ("losses/policy_loss", "losses/value_loss", "losses/entropy"):
        first_a, first_b = scalars(tmp_path / "a", tag), scalars(tmp_path / "b", tag)
        assert first_a and first_a == first_b, tag
    assert scalars(tmp_path / "a", "losses/value_loss") != [] and run_differs(algo, tmp_path)


def test_subproc_envs_train_exactly_like_sync_ones(tmp_path):
    """--vector subproc (worker processes, each holding a block of envs) changes where envs step, not what they do."""
    for vector in ("sync", "subproc"):
        flags = ["--num-envs", 3, "--total-timesteps", 150, "--eval-interval", 0, "--seed", 3, "--vector", vector]
        run("mappo", *flags, "--run-dir", tmp_path / vector)
    for tag in ("losses/policy_loss", "losses/value_loss", "charts/episodic_return"):
        sync = [v for _, v in scalars(tmp_path / "sync", tag)]
        assert sync and sync == [v for _, v in scalars(tmp_path / "subproc", tag)], tag


def run_differs(algo, tmp_path):
    """A different seed gives different losses: the determinism check above is not vacuous."""
    run(algo, "--total-timesteps", 100, "--eval-interval", 0, "--seed", 4, "--run-dir", tmp_path / "c")
    return scalars(tmp_path / "c", "losses/value_loss") != scalars(tmp_path / "a", "losses/value_loss")


def test_resume_continues_the_step_counter(tmp_path):
    run("mappo", "--total-timesteps", 100, "--eval-interval", 0, "--run-dir", tmp_path)
    run("mappo", "--total-timesteps", 200, "--eval-interval", 0, "--resume", tmp_path)
    steps = [s for s, _ in scalars(tmp_path, "charts/SPS")]
    assert steps == [50, 100, 150, 200]
    assert torch.load(tmp_path / "last.pt", weights_only=True)["global_step"] == 200


@pytest.mark.parametrize(
    "sig, again", [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["ctrl-c", "sigterm", "ctrl-c-again-and-again"],
)  # fmt: skip
def test_ctrl_c_or_sigterm_saves_last_checkpoint_and_exits_cleanly(sig, again, tmp_path):
    """Ctrl-C, and SIGTERM (kill, a cluster's preemption, run.py stopping a sweep), both save last.pt. More Ctrl-Cs
    while it saves and exits change nothing: the exit code stays 130 (they once killed the exit after the save)."""
    cmd = [sys.executable, str(ROOT / "algos" / "mappo.py"), *TINY, "--total-timesteps", "10000000"]
    proc = subprocess.Popen([*cmd, "--run-dir", str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.time() + 120
    while not scalars(tmp_path, "charts/SPS") and time.time() < deadline:  # wait for a finished iteration
        time.sleep(0.5)
    proc.send_signal(sig)
    while again and proc.poll() is None:  # one more every 0.2 s until it has exited
        time.sleep(0.2)
        proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=180)  # saving under a loaded CI can be slow
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr and f"--resume {tmp_path}" in stdout
    assert torch.load(tmp_path / "last.pt", weights_only=True)["global_step"] >= 50


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--env", "no_such_env_v0"], "unknown env id"),
        (["--env", "battle_v4", "--continuous-actions"], "continuous_actions"),
        (["--env-kwargs", "{bad json"], "--env-kwargs is not valid JSON"),
        (["--random-groups", "zombies"], "--random-groups ['zombies']"),
        (["--eval-checkpoint", "/no/such/file.pt"], "does not exist"),
        (["--rnn", "--rnn-chunk", "7"], "--rnn-chunk 7 must divide --num-steps 25"),
        (["--num-steps", "0"], "--num-steps 0 must be a positive integer"),
        (["--rnn", "--rnn-chunk", "0"], "--rnn-chunk 0 must be a positive integer"),
        (["--num-minibatches", "51"], "--num-minibatches 51 exceeds the rollout's 50 env steps"),
        (["--total-timesteps", "49"], "--total-timesteps 49 is less than one rollout"),
    ],
)
def test_bad_input_fails_with_one_clear_error(flags, message):
    proc = run("mappo", *flags, check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error:") and message.lower() in proc.stderr.lower(), proc.stderr


def test_corrupt_or_foreign_checkpoint_is_refused(tmp_path):  # every case of runtime/checkpoint.py: test_runtime.py
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint at all")
    proc = run("mappo", "--eval-checkpoint", bad, check=False)
    assert proc.returncode == 2 and "unreadable" in proc.stderr and "Traceback" not in proc.stderr
    run("mappo", "--total-timesteps", 50, "--eval-interval", 0, "--run-dir", tmp_path / "r")
    proc = run("mappo", "--env", "simple_adversary_v3", "--eval-checkpoint", tmp_path / "r" / "last.pt", check=False)
    assert proc.returncode == 2 and "was trained on simple_spread_v3, not simple_adversary_v3" in proc.stderr


def test_without_numbas_compilation_a_run_says_so_once_and_learns_alike(tmp_path, monkeypatch):
    """NUMBA_DISABLE_JIT: every kernel (GAE, runtime/mlp.py's acting pass, ...) runs as plain Python: one line says
    so, and the run's losses are those of the compiled run (float rounding apart)."""
    flags = ("--total-timesteps", 200, "--eval-interval", 0, "--seed", 3)
    compiled = run("ippo", *flags, "--run-dir", tmp_path / "jit")
    monkeypatch.setenv("NUMBA_DISABLE_JIT", "1")
    plain = run("ippo", *flags, "--run-dir", tmp_path / "plain", own_process=True)
    notice = "NUMBA_DISABLE_JIT is set: the compiled kernels"
    assert plain.stderr.count(notice) == 1 and notice not in compiled.stderr
    for tag in ("losses/policy_loss", "losses/value_loss", "losses/entropy"):
        got, want = scalars(tmp_path / "plain", tag), scalars(tmp_path / "jit", tag)
        assert len(got) == len(want) == 4 and np.allclose(got, want, rtol=1e-4, atol=1e-6), (tag, got, want)


def test_numba_backend_trains(tmp_path):
    run("mappo", "--total-timesteps", 100, "--eval-interval", 0, "--run-dir", tmp_path, "--backend", "numba")
    assert "MPEVecEnv" in (tmp_path / "config.json").read_text()


@pytest.mark.parametrize("algo", ALGOS)
def test_resume_keeps_the_best_checkpoint_of_before(algo, tmp_path, resume_keeps_best):
    """Checkpoints carry the best evaluation so far, so a resumed run replaces best.pt only with a better one."""
    go = lambda steps, *flags: run(algo, "--total-timesteps", steps, "--eval-interval", 50, *flags)  # noqa: E731
    resume_keeps_best(tmp_path, lambda: go(100, "--run-dir", tmp_path), lambda: go(200, "--resume", tmp_path), scalars)


@pytest.mark.parametrize("algo", ALGOS)
def test_nan_loss_keeps_the_last_sound_checkpoint_and_resumes_with_a_lower_learning_rate(algo, tmp_path):
    proc = run(algo, "--total-timesteps", 200, "--eval-interval", 0, "--learning-rate", 1e30, "--run-dir", tmp_path,
               check=False)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last_line = proc.stderr.strip().splitlines()[-1]
    assert re.match(r"error: group agent: the loss became (nan|-?inf) .*last.pt holds step 0", last_line), last_line
    ckpt = torch.load(tmp_path / "last.pt", weights_only=True)
    # the first update diverged within its epochs: last.pt holds the initial weights and untouched Adam moments
    assert ckpt["counters"] == {} and ckpt["global_step"] == 0 and ckpt["optimizers"]["agent"]["state"] == {}
    assert max(v.abs().max().item() for v in ckpt["nets"]["agent"].values()) < 10
    run(algo, "--total-timesteps", 200, "--eval-interval", 0, "--learning-rate", 7e-4, "--resume", tmp_path)
    assert torch.load(tmp_path / "last.pt", weights_only=True)["global_step"] == 200 and (tmp_path / "DONE").exists()
    final = (tmp_path / "final_eval.json").read_bytes()  # a finished run resumed with no more steps to take: said,
    events = sorted(p.name for p in tmp_path.glob("events.*"))  # and nothing rewritten (it evaluated again, rewrote
    proc = run(algo, "--total-timesteps", 100, "--eval-interval", 0, "--resume", tmp_path)  # final_eval.json, and
    assert f"{tmp_path} finished at step 200; --total-timesteps 100 asks for no more: nothing to train" in proc.stdout
    assert (tmp_path / "DONE").exists() and (tmp_path / "final_eval.json").read_bytes() == final  # logged a second
    assert sorted(p.name for p in tmp_path.glob("events.*")) == events  # final eval to TensorBoard)


def make_policy(algo, **flags):
    from runtime.opponents import script_module

    module = script_module(algo)
    spec = types.SimpleNamespace(name="agent", n_agents=1, obs_shape=(4,), action_dim=5, discrete=True)
    args = module.Args(**flags)
    return module.Policy(spec, 4, args) if algo == "mappo" else module.Policy(spec, args)  # ippo: no state


@pytest.mark.parametrize("algo", ALGOS)
def test_input_normalization_keeps_each_observations_scale(algo):
    """simple_v3's observation is [velocity, landmark - position]: at rest, a landmark 0.3 away and one 3.0 away in
    the same direction differ only in scale, and the policy must tell them apart to brake in time. The paper's input
    LayerNorm mapped both to one input (LayerNorm(x) == LayerNorm(10x)), so both got the same action distribution;
    --feature-norm normalizes each feature by its running statistics, an affine map that keeps them apart."""
    torch.manual_seed(0)
    pol = make_policy(algo)
    rng = np.random.default_rng(0)
    obs = np.concatenate([0.2 * rng.standard_normal((16, 8, 1, 2)), rng.standard_normal((16, 8, 1, 2))], -1)
    pol.update_input_norms({"agent_mask": np.ones((16, 8, 1), bool), "obs": obs, "state": obs.squeeze(2)})
    near, far = torch.tensor([[[0.0, 0.0, 0.1, -0.3]]]), torch.tensor([[[0.0, 0.0, 1.0, -3.0]]])
    logits_near, logits_far = pol.actor_out(near)[0], pol.actor_out(far)[0]
    assert (logits_near - logits_far).abs().max() > 1e-3  # the actor's outputs (std 0.01 at init) differ
    values_near = pol.critic_values(near if algo == "ippo" else near[0])[0]
    values_far = pol.critic_values(far if algo == "ippo" else far[0])[0]
    assert (values_near - values_far).abs().max() > 1e-2


@pytest.mark.parametrize("algo", ALGOS)
def test_input_statistics_are_those_of_the_living_agents_and_are_checkpointed(algo):
    torch.manual_seed(0)
    pol = make_policy(algo)
    rng = np.random.default_rng(1)
    obs, alive = rng.normal(2.0, 3.0, (25, 4, 1, 4)), rng.random((25, 4, 1)) < 0.7
    obs[~alive] = 0.0  # a dead agent's observation is zeros: it must not pull the statistics
    pol.update_input_norms({"agent_mask": alive, "obs": obs, "state": obs.squeeze(2)})
    pol.update_input_norms({"agent_mask": alive, "obs": obs, "state": obs.squeeze(2)})  # the merge of two batches
    both = np.concatenate([obs[alive], obs[alive]])
    torch.testing.assert_close(pol.obs_norm.mean, torch.tensor(both.mean(0), dtype=torch.float32), atol=1e-3, rtol=0)
    torch.testing.assert_close(pol.obs_norm.var, torch.tensor(both.var(0), dtype=torch.float32), atol=1e-2, rtol=1e-3)
    fresh = make_policy(algo)
    fresh.load_state_dict(pol.state_dict())  # the statistics travel with the weights
    x = torch.tensor(obs[:2, :, :, :].reshape(8, 1, 4), dtype=torch.float32)
    torch.testing.assert_close(fresh.actor_out(x)[0], pol.actor_out(x)[0])


@pytest.mark.parametrize("algo", ALGOS)
def test_checkpoints_from_before_the_running_normalization_still_load(algo):
    """Their args hold feature_norm True (the input LayerNorm) or False: they build the networks they were saved."""
    for old, now in ((True, "layer"), (False, "none")):
        saved = make_policy(algo, feature_norm=now).state_dict()
        make_policy(algo, feature_norm=old).load_state_dict(saved)  # strict: the same modules and buffers


@pytest.mark.parametrize("feature_norm", ["running", "layer", "none"])
@pytest.mark.parametrize("rnn", [False, True])
def test_critic_takes_the_state_once_and_equals_the_per_agent_input(feature_norm, rnn):
    """mappo's shared critic on [state, one-hot id] for every agent, computed from the state once, equals the critic
    on the (B, A, S + A) input built per agent, with non-trivial input statistics, weights and hidden states."""
    from runtime.opponents import script_module

    mappo = script_module("mappo")
    torch.manual_seed(0)
    spec = types.SimpleNamespace(name="agent", n_agents=5, obs_shape=(6,), action_dim=4, discrete=True)
    args = mappo.Args(feature_norm=feature_norm, rnn=rnn, hidden_size=16)
    pol = mappo.Policy(spec, 11, args)
    with torch.no_grad():
        for p in pol.critic.parameters():
            p.add_(0.3 * torch.randn_like(p))  # LayerNorm's weight and bias (`layer`) away from 1 and 0
    if feature_norm == "running":
        rng = np.random.default_rng(0)
        pol.update_input_norms({"agent_mask": np.ones((3, 2, 5), bool), "obs": rng.standard_normal((3, 2, 5, 6)),
                                "state": rng.normal(1.0, 3.0, (3, 2, 11))})  # fmt: skip
    state = 2.0 * torch.randn(7, 11) + 0.5
    hx = torch.randn(7, 5, 16) if rnn else None
    fast, h_fast = pol.critic_values(state, hx)
    plain, h_plain = pol.critic(pol._with_id(pol.state_norm(state).unsqueeze(1).expand(-1, 5, -1)), hx)
    torch.testing.assert_close(fast, plain.squeeze(-1), rtol=1e-5, atol=1e-5)
    if rnn:
        torch.testing.assert_close(h_fast, h_plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("share_params", [True, False])
def test_rnn_chunks_in_one_call_equal_the_step_by_step_unroll(algo, share_params):
    """forward_batch runs each chunk's recurrence in one call (runtime/gru.py); the outputs, values and the loss's
    gradients equal acting's one-step cell applied step by step, hidden states restarting where episodes began."""
    from runtime.opponents import script_module

    module = script_module(algo)
    torch.manual_seed(0)
    spec = types.SimpleNamespace(name="agent", n_agents=3, obs_shape=(6,), action_dim=4, discrete=True)
    args = module.Args(rnn=True, hidden_size=16, share_params=share_params)
    pol = module.Policy(spec, 9, args) if algo == "mappo" else module.Policy(spec, args)  # ippo: no state
    L, N = 7, 5
    mb = {"obs": torch.randn(L, N, 3, 6), "state": torch.randn(L, N, 9), "h_actor": torch.randn(L, N, 3, 16),
          "h_critic": torch.randn(L, N, 3, 16), "starts": (torch.rand(L, N) < 0.3).float()}  # fmt: skip

    def unrolled():
        outs, values, ha, hc = [], [], mb["h_actor"][0], mb["h_critic"][0]
        for i in range(L):
            keep = (1 - mb["starts"][i]).view(-1, 1, 1)
            out, ha = pol.actor_out(mb["obs"][i], ha * keep)
            v, hc = pol.critic_values(mb["state" if algo == "mappo" else "obs"][i], hc * keep)
            outs.append(out)
            values.append(v)
        return torch.stack(outs), torch.stack(values)

    results = []
    for forward in (lambda: module.forward_batch(pol, mb, args), unrolled):
        pol.zero_grad()
        out, values = forward()
        (out.square().sum() + values.sin().sum()).backward()
        results.append([out.detach(), values.detach(), *(p.grad.clone() for p in pol.parameters())])
    for fast, plain in zip(*results, strict=True):
        torch.testing.assert_close(fast, plain, rtol=1e-4, atol=1e-5)


class _TorchCategorical(torch.distributions.Categorical):  # the plain path: torch's own distribution
    def __init__(self, logits, avail=None):
        super().__init__(logits=logits if avail is None else logits.masked_fill(avail == 0, -1e9), validate_args=False)

    mode = property(lambda self: self.probs.argmax(-1))


def _plain_group_linear(self, x):  # the layers as plain products: a loop over the stacks (one, when shared)
    return torch.stack([x[k] @ self.weight[k] + self.bias[k] for k in range(len(x))])


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("share_params", [True, False])
@pytest.mark.parametrize("avail", [False, True], ids=["all-actions", "action-masks"])
def test_the_fast_update_equals_the_plain_one_on_a_fixed_batch(algo, share_params, avail, monkeypatch):
    """The update's fast parts (runtime.Categorical, one baddbmm per layer, foreach clipping, fused Adam) against
    their plain forms (torch.distributions.Categorical, products plus bias, nn.utils.clip_grad_norm_, the
    per-tensor Adam): the same losses and the same weights after two epochs of two minibatches."""
    from buffers import RolloutBuffer
    from runtime.opponents import script_module

    module = script_module(algo)
    spec = types.SimpleNamespace(name="agent", n_agents=3, obs_shape=(6,), action_dim=5, discrete=True,
                                 has_action_mask=avail)  # fmt: skip
    args = module.Args(share_params=share_params, hidden_size=32, update_epochs=2, num_minibatches=2)
    rng = np.random.default_rng(0)
    fields = module.rollout_fields(spec, (9,), args) if algo == "mappo" else module.rollout_fields(spec, args)
    rb = RolloutBuffer(8, 4, fields)
    for _ in range(8):
        mask = rng.random((4, 3, 5)) < 0.7
        mask[..., 0] = True
        actions = rng.integers(0, 5, (4, 3)) * (mask.all(-1) if avail else 1)  # masked rows: action 0, available
        rb.add(obs=rng.standard_normal((4, 3, 6)), actions=actions, logprobs=-rng.random((4, 3)) - 1,
               values=rng.standard_normal((4, 3)), rewards=rng.standard_normal((4, 3)),
               terminated=rng.random((4, 3)) < 0.1, truncated=np.zeros(4, bool), final_values=np.zeros((4, 3)),
               agent_mask=rng.random((4, 3)) < 0.9, **({"avail_actions": mask} if avail else {}),
               **({"state": rng.standard_normal((4, 9))} if algo == "mappo" else {}))  # fmt: skip
    rb.compute_gae(rng.standard_normal((4, 3)).astype(np.float32), 0.99, 0.95)

    results = []
    for plain in (False, True):
        with monkeypatch.context() as m:
            if plain:
                m.setattr(module, "Categorical", _TorchCategorical)
                m.setattr(module.GroupLinear, "forward", _plain_group_linear)
                m.setattr(module, "clip_grad_norm", torch.nn.utils.clip_grad_norm_)
            torch.manual_seed(0)
            pol = module.Policy(spec, 9, args) if algo == "mappo" else module.Policy(spec, args)
            opt = torch.optim.Adam(pol.parameters(), lr=1e-3, eps=1e-5, foreach=False) if plain else module.adam(
                pol.parameters(), 1e-3, eps=1e-5)  # fmt: skip
            losses = module.update(pol, opt, rb, args, "cpu", np.random.default_rng(1))
            results.append((losses, [p.detach().clone() for p in pol.parameters()]))
    (fast, fast_weights), (plain, plain_weights) = results
    assert fast.keys() == plain.keys()
    for k in fast:
        assert fast[k] == pytest.approx(plain[k], rel=1e-4, abs=1e-6), k
    for f, p in zip(fast_weights, plain_weights, strict=True):
        torch.testing.assert_close(f, p, rtol=1e-4, atol=1e-6)
