"""The run around an algorithm script: everything in `algos/*.py` that is not the algorithm. A whole script:

    from dataclasses import dataclass

    import numpy as np
    import torch

    from runtime import Categorical, MakePolicy, MultiAgentArgs, Run, adam, check_args, cli, make_env, optimize, setup

    ALGO = "example"  # the script's name: checkpoints of another algorithm are refused
    NETWORK_FLAGS = ()  # flags that shape the networks, e.g. ("hidden_size",): a checkpoint must match them


    @dataclass
    class Args(MultiAgentArgs):  # --env-id, --seed, --total-timesteps, --num-envs, ... come from here
        learning_rate: float = 1e-3
        '''Adam learning rate'''  # a field's docstring is its --help line


    def policy(spec):  # the networks: one linear layer per group, observation -> action logits
        return torch.nn.Linear(int(np.prod(spec.obs_shape)), spec.action_dim)


    def acting(nets, greedy=True) -> MakePolicy:  # the networks as a policy: make(num_envs, rng) -> act_fn(obs, done)
        def make(num_envs, rng):
            def act_fn(obs, done):  # -> {group: actions}
                with torch.no_grad():
                    d = {g: Categorical(net(torch.as_tensor(obs.obs[g]).flatten(2))) for g, net in nets.items()}
                return {g: (d[g].mode if greedy else d[g].sample()).numpy() for g in d}

            return act_fn

        return make


    def main(args):
        check_args(args)  # every flag by the rules of its name; a script's own rules as (ok, message) pairs
        device, rng = setup(args)  # threads, seeds, device
        env = make_env(args, args.num_envs, args.seed)  # the learning groups are env.groups
        nets = {g: policy(spec) for g, spec in env.groups.items()}
        optimizers = {g: adam(nets[g].parameters(), args.learning_rate) for g in nets}
        make_greedy = acting(nets)  # the evaluations' policy
        run = Run(args, ALGO, env, nets, optimizers, rng, make_greedy, network_flags=NETWORK_FLAGS)
        global_step, obs = run.global_step, env.reset()
        with run:  # Ctrl-C / SIGTERM / NaN: last.pt stays sound
            while global_step < args.total_timesteps:
                logits = {g: net(torch.as_tensor(obs.obs[g]).flatten(2)) for g, net in nets.items()}
                actions = {g: Categorical(x).sample() for g, x in logits.items()}
                step = env.step({g: a.numpy() for g, a in actions.items()})
                global_step += args.num_envs
                for g, x in logits.items():  # the algorithm: here a policy gradient on the immediate reward
                    reward = torch.as_tensor(step.rewards[g])
                    optimize(-(Categorical(x).log_prob(actions[g]) * reward).mean(), optimizers[g])
                run.log_episodes(step.episodes, global_step)
                obs = step.next
                run.step(global_step)  # progress, evaluation, periodic last.pt, stop requests
        run.finish()  # last evaluation, last.pt, the final 1000 episodes, DONE
        env.close()


    def actor(ckpt, group, spec, device, greedy=True) -> MakePolicy:  # a checkpoint's group as a policy (opponents)
        net = policy(spec)
        net.load_state_dict(ckpt["nets"][group])
        return acting({group: net}, greedy)


    if __name__ == "__main__":
        cli(Args, main)

(tests/test_layer.py writes this example to a file and runs it: it trains, evaluates, reloads and plays.)

The contract a script keeps (tests/test_repo.py and the script tests hold most of it):
* `Args` is a dataclass of `MultiAgentArgs` (or `RunArgs` for a Gymnasium script); a flag with a choice of values is
  a `Literal`. `check_args` checks every flag it has against the rules of runtime/checks.py, chosen by the flag's
  name (`POSITIVE_INT`, `UNIT`, ...: a new flag with a range joins a list there, or gets a script rule). A default
  changed after checkpoints were written goes into `Args.BEFORE_FLAGS` (the value older checkpoints had).
* `ALGO` and `NETWORK_FLAGS` as above; `Run(..., same_flags=(...))` names the other flags that a resumed run must
  keep (`--num-envs` always).
* Acting, named by role: `act(...)` picks a training step's actions (the script's own signature); module-level
  `acting(networks, ..., greedy=True) -> MakePolicy` makes the networks a policy, `make(num_envs, rng) ->
  act_fn(obs, done) -> {group: actions}` (the protocols `MakePolicy` and `Act` of runtime/opponents.py), whose greedy
  form `make_greedy` plays the evaluations; and module-level `actor(ckpt, group, spec, device, greedy=True) ->
  MakePolicy` (`CheckpointActor`) builds the same from a checkpoint, hidden states reset with `reset_finished`
  (runtime/opponents.py imports the script that wrote a checkpoint by its path and calls it:
  --opponent, --self-play, results/tournament.py).
* `Run` plays `--eval-checkpoint` instead of training (the script ends there, exit code 0), reloads `--resume`, and
  with `replay=` saves and reloads an off-policy buffer. Its optional flags are read by name when a script has them:
  `--save-buffer`, `--self-play`.
* A non-finite loss raises `FloatingPointError` before the optimizer steps: `check_finite(loss, name, advice, **terms)`
  (or `optimize`, which calls it) is the one NaN guard; losses are logged as `losses/<name>`
  (bench/compare_losses.py compares them between commits) and the speed as `charts/SPS`.
* The learning groups are `env.groups`: `make_env` acts for the frozen ones (--random-groups, --opponent,
  --self-play) and shows the script only the learners.

Modules: `args` (the shared flags, env construction, and freed memory kept for reuse), `checks` (argument checks),
`checkpoint` (atomic save, validated load), `optim` (fused Adam, foreach clipping, the NaN guard, the guarded optimizer
step with per-agent clipping, soft targets), `schedule` (linear schedules and interval crossings), `categorical` (the
policy-gradient scripts' categorical distribution, at a fraction of torch's cost on a few actions), `gru` (a GRU over a
whole sequence in one call, and the reset of hidden states where episodes end), `layers` (GroupLinear: n agents' linear
layers in one batched product; per_agent on (B, A, d) rows), `mlp` (the acting pass of a feed-forward network in one
call), `norm` (running mean/std of value targets and inputs, and the --feature-norm flag), `evaluation` (protocol v2),
`run` (run dir, lock, writer, signals), `opponents` (groups frozen to random, to any script's checkpoint, or to
self-play).
Dependencies go one way: algos -> runtime -> {envs, buffers}.
"""

import os

# The compiled kernels' products (runtime/gru.py, runtime/mlp.py) go to the BLAS that Numba binds (SciPy's OpenBLAS,
# loaded when they first run). Its threads do not pay at these sizes (a product of 12-400 rows): on this project's
# 2-core machine a second thread, or the count lowered at run time (threadpoolctl, which leaves the spare threads
# spinning), made each product several times slower. OpenBLAS reads the count once, when it loads:
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


from runtime.args import (
    MultiAgentArgs,
    RunArgs,
    checkpoint_args,
    cli,
    env_kwargs,
    env_signature,
    keep_freed_memory,
    make_env,
    make_eval_env,
    setup,
)
from runtime.categorical import Categorical
from runtime.checkpoint import CheckpointError, groups_state, load_checkpoint, restore, save_checkpoint, sub_state
from runtime.checks import (
    ArgumentError,
    CheckpointPlayed,
    RunFinished,
    RunStopped,
    check_action_flags,
    check_args,
    check_discrete,
    episode_length,
)
from runtime.evaluation import FINAL_EPISODES, FINAL_SEED, evaluate, periodic_seed
from runtime.gru import gru_sequence, reset_finished
from runtime.layers import GroupLinear, per_agent
from runtime.mlp import fast_acting, mlp_forward
from runtime.norm import INPUT_CLIP, InputNorm, RunningNorm, feature_norm, standardised_rewards
from runtime.opponents import Act, CheckpointActor, MakePolicy
from runtime.optim import adam, check_finite, clip_grad_norm, optimize, soft_update
from runtime.run import Run
from runtime.schedule import crossings, linear_schedule

__all__ = [
    "Act",
    "CheckpointActor",
    "MakePolicy",
    "adam",
    "FINAL_EPISODES",
    "FINAL_SEED",
    "GroupLinear",
    "INPUT_CLIP",
    "InputNorm",
    "ArgumentError",
    "Categorical",
    "CheckpointError",
    "MultiAgentArgs",
    "Run",
    "RunArgs",
    "RunFinished",
    "RunStopped",
    "RunningNorm",
    "standardised_rewards",
    "check_action_flags",
    "check_finite",
    "clip_grad_norm",
    "check_args",
    "checkpoint_args",
    "check_discrete",
    "CheckpointPlayed",
    "crossings",
    "episode_length",
    "linear_schedule",
    "cli",
    "env_kwargs",
    "env_signature",
    "keep_freed_memory",
    "evaluate",
    "fast_acting",
    "feature_norm",
    "groups_state",
    "gru_sequence",
    "load_checkpoint",
    "make_env",
    "mlp_forward",
    "make_eval_env",
    "optimize",
    "per_agent",
    "periodic_seed",
    "reset_finished",
    "restore",
    "save_checkpoint",
    "setup",
    "soft_update",
    "sub_state",
]
