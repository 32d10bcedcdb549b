"""The run around an algorithm script: everything in `algos/*.py` that is not the algorithm.

    from runtime import MultiAgentArgs, Run, check_args, cli, make_env, setup

    @dataclass
    class Args(MultiAgentArgs):          # --env-id, --seed, --total-timesteps, ... come from here
        learning_rate: float = 7e-4      # the algorithm's own flags

    def main(args):
        check_args(args)                             # every flag, before any work
        device, rng = setup(args)                    # threads, seeds, device
        env = make_env(args, args.num_envs, args.seed)
        ...networks, optimizers...
        run = Run(args, ALGO, env, nets, optimizers, rng, policy=greedy)   # run dir, lock, writer, resume
        with run:                                    # Ctrl-C / SIGTERM / NaN: last.pt stays sound
            while run.global_step < args.total_timesteps:
                ...act, step, store, update...
                run.step(global_step, iteration=it)  # progress, evaluation, periodic last.pt, stop requests
        run.finish()                                 # last evaluation, last.pt, the final 1000 episodes, DONE

    if __name__ == "__main__":
        cli(Args, main)

Modules: `args` (the shared flags, env construction, and freed memory kept for reuse), `checks` (argument checks),
`checkpoint` (atomic save, validated load), `optim` (fused Adam, foreach clipping, the guarded optimizer step with
per-agent clipping, soft targets), `categorical` (the policy-gradient scripts' categorical distribution, at a fraction
of torch's cost on a few actions), `gru` (a GRU over a whole sequence in one call), `mlp` (the acting pass of a
feed-forward network in one call), `norm` (running mean/std of value targets and inputs, and the --feature-norm flag),
`evaluation` (protocol v2), `run` (run dir, lock, writer, signals), `opponents` (groups frozen to random, to any
script's checkpoint, or to self-play: every script's `actor(ckpt, group, ...)`).
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
from runtime.checkpoint import CheckpointError, load_checkpoint, restore, save_checkpoint, sub_state
from runtime.checks import ArgumentError, RunStopped, check_action_flags, check_args, check_discrete, check_groups
from runtime.evaluation import FINAL_EPISODES, FINAL_SEED, evaluate, evaluate_checkpoint, periodic_seed
from runtime.gru import gru_sequence
from runtime.mlp import fast_acting, mlp_forward
from runtime.norm import INPUT_CLIP, InputNorm, RunningNorm, feature_norm
from runtime.optim import adam, clip_grad_norm, optimize, soft_update
from runtime.run import Run

__all__ = [
    "adam",
    "FINAL_EPISODES",
    "FINAL_SEED",
    "INPUT_CLIP",
    "InputNorm",
    "ArgumentError",
    "Categorical",
    "CheckpointError",
    "MultiAgentArgs",
    "Run",
    "RunArgs",
    "RunStopped",
    "RunningNorm",
    "check_action_flags",
    "clip_grad_norm",
    "check_args",
    "checkpoint_args",
    "check_discrete",
    "check_groups",
    "cli",
    "env_kwargs",
    "env_signature",
    "keep_freed_memory",
    "evaluate",
    "evaluate_checkpoint",
    "fast_acting",
    "feature_norm",
    "gru_sequence",
    "load_checkpoint",
    "make_env",
    "mlp_forward",
    "make_eval_env",
    "optimize",
    "periodic_seed",
    "restore",
    "save_checkpoint",
    "setup",
    "soft_update",
    "sub_state",
]
