"""Double DQN (Mnih et al. 2015; van Hasselt et al. 2016); results: results/CartPole-v1/dqn.json"""

from dataclasses import dataclass
from typing import Annotated

import numpy as np
import torch
import torch.nn as nn
import tyro

from buffers import PrioritizedReplayBuffer, ReplayBuffer, float_tensor, to_torch
from runtime import (
    MakePolicy,
    Run,
    RunArgs,
    check_args,
    check_discrete,
    check_finite,
    cli,
    crossings,
    linear_schedule,
    setup,
    soft_update,
)
from runtime.args import make_gym_env

ALGO = "dqn"
LOG_EVERY = 100  # env steps between TensorBoard points (CleanRL's dqn.py)


@dataclass
class Args(RunArgs):  # --seed, --cuda, evaluation, checkpoints, --resume: runtime/args.py
    env_id: Annotated[str, tyro.conf.arg(aliases=("--env",))] = "CartPole-v1"
    """Gymnasium id with a Discrete action space (e.g. CartPole-v1, Acrobot-v1); --env is an alias"""
    total_timesteps: int = 500_000
    """env steps, summed over all envs"""
    num_envs: int = 1
    """parallel training envs"""
    eval_interval: int = 10_000
    """env steps between greedy evaluations on fresh episodes (0: only at the end)"""
    save_buffer: bool = True
    """at Ctrl-C, also write the replay buffer to replay.npz, so --resume replays the same data (else it refills)"""

    # --- DQN (defaults: CleanRL's dqn.py for CartPole) ---
    learning_rate: float = 2.5e-4
    """Adam learning rate"""
    buffer_size: int = 10_000
    """replay capacity in transitions"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 1.0
    """target update rate: 1 copies the Q-network (hard update), < 1 is a Polyak (soft) update"""
    target_network_frequency: int = 500
    """env steps between target-network updates (use 1 with a small --tau for a soft update every step)"""
    batch_size: int = 128
    """transitions per gradient step"""
    start_e: float = 1.0
    """epsilon at the start of exploration"""
    end_e: float = 0.05
    """epsilon at the end of exploration"""
    exploration_fraction: float = 0.5
    """fraction of --total-timesteps over which epsilon decays linearly from --start-e to --end-e"""
    learning_starts: int = 10_000
    """env steps of experience collected before learning starts"""
    train_frequency: int = 10
    """env steps per gradient step (summed over envs, so the replay ratio does not depend on --num-envs)"""
    dueling: bool = False
    """dueling head: Q = V + A - mean(A) (Wang et al. 2016)"""
    n_step: int = 1
    """n-step returns: bootstrap from the observation n steps later (Sutton 1988; Hessel et al. 2018)"""
    prioritized: bool = False
    """proportional prioritized replay with priorities |TD error| (Schaul et al. 2016)"""
    prioritized_replay_alpha: float = 0.6
    """priority exponent (0: uniform)"""
    prioritized_replay_beta: float = 0.4
    """initial importance-sampling exponent, annealed linearly to 1 over --total-timesteps"""


class QNetwork(nn.Module):
    """CleanRL's 120-84 ReLU MLP; with --dueling a value stream and a mean-centred advantage stream."""

    def __init__(self, obs_dim, n_actions, dueling):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU())
        self.advantage = nn.Linear(84, n_actions)
        self.value = nn.Linear(84, 1) if dueling else None

    def forward(self, x):  # (B, *obs_shape) -> Q (B, n_actions)
        h = self.body(x.flatten(1))
        a = self.advantage(h)
        if self.value is None:
            return a
        return self.value(h) + a - a.mean(-1, keepdim=True)  # Wang et al. 2016, eq. 9


def acting(q_network, device) -> MakePolicy:
    """`(num_envs, rng) -> act(obs, done) -> actions`: greedy on the Q-values (the evaluations)."""
    return lambda num_envs, rng: lambda obs, done: q_network(float_tensor(obs, device)).argmax(-1).cpu().numpy()


NETWORK_FLAGS = ("dueling",)  # what a checkpoint's weights depend on


def main(args):
    check_args(args)
    device, rng = setup(args)
    env = make_gym_env(args, args.num_envs, args.seed)
    check_discrete(args, env, ALGO)
    obs_shape, n_actions = env.single_observation_space.shape, int(env.single_action_space.n)
    q_network = QNetwork(int(np.prod(obs_shape)), n_actions, args.dueling).to(device)
    target_network = QNetwork(int(np.prod(obs_shape)), n_actions, args.dueling).to(device)
    target_network.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)
    make_greedy = acting(q_network, device)  # evaluation: greedy (epsilon 0)
    nets = {"q_network": q_network, "target_network": target_network}
    fields = {
        "obs": (obs_shape, np.float32),
        "next_obs": (obs_shape, np.float32),  # the episode's final observation where it ended
        "actions": ((), np.int64),
        "rewards": ((), np.float32),
        "terminated": ((), np.bool_),  # only termination zeroes the bootstrap
        "truncated": ((), np.bool_),  # a time limit ends the n-step window but still bootstraps
    }
    if args.prioritized:
        rb = PrioritizedReplayBuffer(args.buffer_size, args.num_envs, fields, alpha=args.prioritized_replay_alpha)
    else:
        rb = ReplayBuffer(args.buffer_size, args.num_envs, fields)
    run = Run(args, ALGO, env, nets, {"q_network": optimizer}, rng, make_greedy, network_flags=NETWORK_FLAGS, replay=rb)
    writer, global_step = run.writer, run.global_step
    train_start = global_step + (0 if run.replay_restored else args.learning_starts)  # else the buffer refills
    losses = {}
    obs, _ = env.reset()
    with run:
        while global_step < args.total_timesteps:
            # ACT: epsilon-greedy with a linearly decaying epsilon
            epsilon = linear_schedule(
                args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
            )
            with torch.no_grad():
                greedy_actions = q_network(float_tensor(obs, device)).argmax(-1).cpu().numpy()
            explore = rng.random(args.num_envs) < epsilon
            actions = np.where(explore, rng.integers(n_actions, size=args.num_envs), greedy_actions)
            # STEP
            next_obs, rewards, terminated, truncated, infos = env.step(actions)
            global_step += args.num_envs
            # STORE: the final observation of a finished episode, not the first of the next one
            real_next_obs = next_obs.copy()
            for i in np.flatnonzero(infos.get("_final_obs", [])):
                real_next_obs[i] = infos["final_obs"][i]
            rb.add(
                obs=obs,
                next_obs=real_next_obs,
                actions=actions,
                rewards=rewards,
                terminated=terminated,
                truncated=truncated,
            )
            run.log_episodes(infos, global_step)
            obs = next_obs

            # TARGETS and UPDATE: one gradient step per --train-frequency env steps
            if global_step > train_start and len(rb) >= args.batch_size:
                beta = linear_schedule(
                    args.prioritized_replay_beta, 1.0, args.total_timesteps, global_step
                )  # to 1 (--prioritized)
                for _ in range(crossings(global_step, args.num_envs, args.train_frequency)):
                    losses = update(q_network, target_network, optimizer, rb, args, device, rng, beta)
                if crossings(global_step, args.num_envs, args.target_network_frequency):
                    soft_update(target_network, q_network, args.tau)

            # LOG
            if crossings(global_step, args.num_envs, LOG_EVERY):
                for k, v in losses.items():
                    writer.add_scalar(f"losses/{k}", v, global_step)
                writer.add_scalar("charts/SPS", run.sps(global_step), global_step)
                writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
                writer.add_scalar("charts/epsilon", epsilon, global_step)
            run.step(global_step)  # EVAL, checkpoints, and where Ctrl-C stops the run
    run.finish()
    env.close()


# --- what the loop calls: the (double, n-step, prioritized) DQN update ---


def update(q_network, target_network, optimizer, rb, args, device, rng, beta):
    """One gradient step on a replayed batch: Double-DQN n-step targets, importance-weighted squared TD error."""
    if args.prioritized:
        batch = rb.sample(args.batch_size, rng, beta=beta, n_step=args.n_step, gamma=args.gamma)
    else:
        batch = rb.sample(args.batch_size, rng, n_step=args.n_step, gamma=args.gamma)
    if args.n_step == 1:  # n-step sampling returns the bootstrap factor itself: gamma^m, or 0 after a termination
        batch["discounts"] = args.gamma * (1.0 - batch["terminated"])
    mb = to_torch(batch, device)
    # TARGETS: the online network picks the next action, the target network evaluates it (van Hasselt et al. 2016)
    with torch.no_grad():
        next_actions = q_network(mb["next_obs"]).argmax(-1, keepdim=True)
        next_q = target_network(mb["next_obs"]).gather(-1, next_actions).squeeze(-1)
        td_target = mb["rewards"] + mb["discounts"] * next_q
    q = q_network(mb["obs"]).gather(-1, mb["actions"].unsqueeze(-1)).squeeze(-1)
    td_error = td_target - q
    loss = (mb["weights"] * td_error**2).mean() if args.prioritized else (td_error**2).mean()
    check_finite(loss, "the TD loss", "lower --learning-rate or check the reward scale")
    # UPDATE
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if args.prioritized:  # new priorities: the TD errors just measured
        rb.update_priorities(batch["indices"], td_error.abs().detach().cpu().numpy())
    return dict(td_loss=loss.item(), q_values=q.mean().item())


if __name__ == "__main__":
    cli(Args, main)
