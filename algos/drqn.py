"""DRQN (Hausknecht & Stone 2015, arXiv:1507.06527) with a GRU; results: results/CartPole-PO-v1/drqn.json"""

from dataclasses import dataclass
from typing import Annotated

import numpy as np
import torch
import torch.nn as nn
import tyro

from buffers import EpisodeReplayBuffer, float_tensor, to_torch
from runtime import (
    MakePolicy,
    Run,
    RunArgs,
    check_args,
    check_discrete,
    check_finite,
    cli,
    crossings,
    episode_length,
    linear_schedule,
    reset_finished,
    setup,
    soft_update,
)
from runtime.args import make_gym_env

ALGO = "drqn"
LOG_EVERY = 100  # env steps between TensorBoard points


@dataclass
class Args(RunArgs):  # --seed, --cuda, evaluation, checkpoints, --resume: runtime/args.py
    env_id: Annotated[str, tyro.conf.arg(aliases=("--env",))] = "CartPole-PO-v1"
    """Gymnasium id with a Discrete action space (CartPole-PO-v1: CartPole without velocities); --env is an alias"""
    total_timesteps: int = 500_000
    """env steps, summed over all envs"""
    num_envs: int = 4
    """parallel training envs"""
    eval_interval: int = 10_000
    """env steps between greedy evaluations on fresh episodes (0: only at the end)"""
    save_buffer: bool = True
    """at Ctrl-C, also write the replay buffer to replay.npz, so --resume replays the same data (else it refills)"""

    # --- DRQN (stored whole episodes, trained on random windows from a zero state: Hausknecht & Stone's
    # "bootstrapped random updates" with R2D2's burn-in; --seq-len 0 trains on whole episodes) ---
    learning_rate: float = 5e-4
    """Adam learning rate"""
    buffer_size: int = 2_000
    """replay capacity in episodes"""
    max_episode_len: int | None = None
    """longest storable episode (default: the env's time limit)"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 1.0
    """target update rate: 1 copies the Q-network (hard update), < 1 is a Polyak (soft) update"""
    target_network_frequency: int = 1_000
    """env steps between target-network updates"""
    batch_size: int = 32
    """episodes per gradient step"""
    start_e: float = 1.0
    """epsilon at the start of exploration"""
    end_e: float = 0.05
    """epsilon at the end of exploration"""
    exploration_fraction: float = 0.25
    """fraction of --total-timesteps over which epsilon decays linearly from --start-e to --end-e"""
    learning_starts: int = 10_000
    """env steps of experience collected before learning starts"""
    train_frequency: int = 10
    """env steps per gradient step (summed over envs)"""
    seq_len: int = 20
    """train on a random window of this many steps per sampled episode (0: whole episodes, ~15x slower on CPU)"""
    burn_in: int = 10
    """steps that only warm up the GRU state (R2D2): before each --seq-len window, or an episode's first steps"""
    hidden_size: int = 64
    """width of the hidden layers"""
    max_grad_norm: float = 10.0
    """global gradient-norm clip"""


class RecurrentQNetwork(nn.Module):
    """Linear-ReLU encoder, a GRU over time, a linear Q head (the paper's LSTM replaced by a GRU)."""

    def __init__(self, obs_dim, n_actions, hidden_size):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(obs_dim, hidden_size), nn.ReLU())
        self.gru = nn.GRU(hidden_size, hidden_size)
        self.head = nn.Linear(hidden_size, n_actions)

    def forward(self, obs, h=None):  # obs (T, B, *obs_shape), h (1, B, H) -> Q (T, B, n_actions), h
        out, h = self.gru(self.encoder(obs.flatten(2)), h)
        return self.head(out), h


def acting(q_network, device) -> MakePolicy:
    """`(num_envs, rng) -> act(obs, done) -> actions`: greedy on the recurrent Q-values, each episode from a zero GRU
    state (the evaluations)."""

    def make(num_envs, rng):
        h = None

        def act_fn(obs, done):
            nonlocal h
            h = reset_finished(h, done, env_dim=1)  # nn.GRU's state (1, E, H)
            q, h = q_network(float_tensor(obs, device)[None], h)
            return q[0].argmax(-1).cpu().numpy()

        return act_fn

    return make


NETWORK_FLAGS = ("hidden_size",)  # what a checkpoint's weights depend on


def main(args):
    check_args(args)
    device, rng = setup(args)
    env = make_gym_env(args, args.num_envs, args.seed)
    check_discrete(args, env, ALGO)
    obs_shape, n_actions = env.single_observation_space.shape, int(env.single_action_space.n)
    q_network = RecurrentQNetwork(int(np.prod(obs_shape)), n_actions, args.hidden_size).to(device)
    target_network = RecurrentQNetwork(int(np.prod(obs_shape)), n_actions, args.hidden_size).to(device)
    target_network.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)

    make_greedy = acting(q_network, device)  # evaluation: greedy (epsilon 0)
    nets = {"q_network": q_network, "target_network": target_network}
    max_len = episode_length(args, env.unwrapped.get_attr("spec")[0].max_episode_steps)
    rb = EpisodeReplayBuffer(
        args.buffer_size,
        max_len,
        args.num_envs,
        {
            "obs": (obs_shape, np.float32),  # row len of an episode: its final observation
            "actions": ((), np.int64),
            "rewards": ((), np.float32),
            "terminated": ((), np.bool_),  # a time-limit end is not terminated: its last step bootstraps
        },
    )
    run = Run(args, ALGO, env, nets, {"q_network": optimizer}, rng, make_greedy, network_flags=NETWORK_FLAGS, replay=rb)
    writer, global_step = run.writer, run.global_step
    train_start = global_step + (0 if run.replay_restored else args.learning_starts)  # else the buffer refills
    losses = {}
    obs, _ = env.reset()
    h = torch.zeros(1, args.num_envs, args.hidden_size, device=device)  # GRU state of each env's episode
    with run:
        while global_step < args.total_timesteps:
            # ACT: epsilon-greedy on the recurrent Q-values
            epsilon = linear_schedule(
                args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
            )
            with torch.no_grad():
                q, h = q_network(float_tensor(obs, device)[None], h)
            explore = rng.random(args.num_envs) < epsilon
            actions = np.where(explore, rng.integers(n_actions, size=args.num_envs), q[0].argmax(-1).cpu().numpy())
            # STEP
            next_obs, rewards, terminated, truncated, infos = env.step(actions)
            global_step += args.num_envs
            # STORE: the step into each env's running episode; finished episodes close with their final observation
            rb.add(obs=obs, actions=actions, rewards=rewards, terminated=terminated)
            ended = terminated | truncated
            if (done := np.flatnonzero(ended)).size:
                rb.finish(done, obs=np.stack([infos["final_obs"][i] for i in done]))
                h = reset_finished(h, ended, env_dim=1)  # the next episode starts from a zero state
            run.log_episodes(infos, global_step)
            obs = next_obs

            # TARGETS and UPDATE: one gradient step per --train-frequency env steps
            if global_step > train_start and len(rb) >= args.batch_size:
                for _ in range(crossings(global_step, args.num_envs, args.train_frequency)):
                    losses = update(q_network, target_network, optimizer, rb, args, device, rng)
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


# --- what the loop calls: the recurrent double-DQN update on episode windows ---


def update(q_network, target_network, optimizer, rb, args, device, rng):
    """One gradient step on replayed sequences: Double-DQN targets, squared TD error over the masked steps."""
    # whole episodes, or random --seq-len windows after up to --burn-in steps that only build the GRU state
    mb = to_torch(rb.sample(args.batch_size, rng, seq_len=args.seq_len, burn_in=args.burn_in), device)
    mask = mb["loss_mask"][:-1].float()  # a step's target needs row t + 1
    q, _ = q_network(mb["obs"])  # (W, B, n_actions), unrolled from a zero state
    # TARGETS: the online network picks the next action, the target network evaluates it
    with torch.no_grad():
        next_actions = q[1:].argmax(-1, keepdim=True)
        next_q = target_network(mb["obs"])[0][1:].gather(-1, next_actions).squeeze(-1)
        td_target = mb["rewards"][:-1] + args.gamma * (1.0 - mb["terminated"][:-1]) * next_q
    q_taken = q[:-1].gather(-1, mb["actions"][:-1].unsqueeze(-1)).squeeze(-1)
    n = mask.sum().clamp(min=1.0)
    loss = (mask * (q_taken - td_target) ** 2).sum() / n
    check_finite(loss, "the TD loss", "lower --learning-rate or check the reward scale")
    # UPDATE
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm)
    optimizer.step()
    return dict(td_loss=loss.item(), q_values=((mask * q_taken).sum() / n).item())


if __name__ == "__main__":
    cli(Args, main)
