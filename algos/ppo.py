"""PPO (Schulman et al. 2017, arXiv:1707.06347); results: results/CartPole-v1/ppo.json"""

from dataclasses import dataclass, field
from typing import Annotated

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions import Categorical, Normal

from buffers import RolloutBuffer, float_tensor, to_torch
from runtime import MakePolicy, Run, RunArgs, check_args, check_finite, cli, setup
from runtime.args import make_gym_env

ALGO = "ppo"


@dataclass
class Args(RunArgs):  # --seed, --cuda, evaluation, checkpoints, --resume: runtime/args.py
    env_id: Annotated[str, tyro.conf.arg(aliases=("--env",))] = "CartPole-v1"
    """Gymnasium id with Discrete or Box actions (e.g. CartPole-v1, Pendulum-v1); --env is an alias"""
    total_timesteps: int = 500_000
    """env steps, summed over all envs"""
    num_envs: int = 4
    """parallel training envs"""
    eval_interval: int = 10_000
    """env steps between greedy evaluations on fresh episodes (0: only at the end)"""

    # --- PPO (defaults: CleanRL's ppo.py for CartPole). For Box actions CleanRL's ppo_continuous_action.py
    # uses --learning-rate 3e-4 --num-envs 1 --num-steps 2048 --num-minibatches 32 --update-epochs 10
    # --ent-coef 0 --norm-obs --norm-reward; pass those flags for Pendulum or MuJoCo.
    learning_rate: float = 2.5e-4
    """Adam learning rate"""
    anneal_lr: bool = True
    """linear learning-rate decay to 0"""
    num_steps: int = 128
    """steps per env per rollout"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE lambda (bias-variance trade-off of the advantages)"""
    num_minibatches: int = 4
    """minibatches per update epoch"""
    update_epochs: int = 4
    """passes over each rollout"""
    norm_adv: bool = True
    """advantage normalization per minibatch"""
    clip_coef: float = 0.2
    """surrogate clipping coefficient epsilon"""
    clip_vloss: bool = True
    """value clipping around the old prediction"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """global gradient-norm clip"""
    target_kl: float | None = None
    """stop the update epochs early when the approximate KL exceeds this"""
    hidden_size: int = 64
    """width of the hidden layers"""
    norm_obs: bool = False
    """normalize observations by running mean/std, clipped to +-10 (saved in the checkpoint)"""
    norm_reward: bool = False
    """scale rewards by the running std of the discounted return, clipped to +-10 (training only)"""

    # --- derived at runtime ---
    batch_size: int = field(default=0, init=False)
    """env steps per rollout: num_envs * num_steps"""
    minibatch_size: int = field(default=0, init=False)
    """batch_size // num_minibatches"""
    num_iterations: int = field(default=0, init=False)
    """rollouts in the run: total_timesteps // batch_size"""


def layer_init(layer, std=2**0.5, bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class RunningMeanStd(nn.Module):
    """Running mean and variance (parallel merge of batch moments); buffers, so saved with the weights."""

    def __init__(self, shape=()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    def update(self, x):  # x (N, *shape)
        x = x.to(self.mean)
        batch_mean, batch_var, n = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta, total = batch_mean - self.mean, self.count + n
        self.mean += delta * n / total
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.count = total


class Agent(nn.Module):
    """Separate tanh actor and critic MLPs; Categorical or diagonal Gaussian (state-independent log-std)."""

    def __init__(self, obs_dim, action_space, args):
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        act_dim = int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        h = args.hidden_size

        def mlp(d_out, out_std):
            hidden = [layer_init(nn.Linear(obs_dim, h)), nn.Tanh(), layer_init(nn.Linear(h, h)), nn.Tanh()]
            return nn.Sequential(*hidden, layer_init(nn.Linear(h, d_out), std=out_std))

        self.critic, self.actor = mlp(1, 1.0), mlp(act_dim, 0.01)
        if not self.discrete:
            self.actor_logstd = nn.Parameter(torch.zeros(act_dim))
        self.obs_rms, self.return_rms = RunningMeanStd((obs_dim,)), RunningMeanStd()
        self.register_buffer("norm_obs", torch.tensor(args.norm_obs))  # a checkpoint brings its own setting

    def preprocess(self, obs, device, update=False):
        """Flatten, and with --norm-obs normalize by the running statistics (updated on training steps only)."""
        x = float_tensor(obs, device).flatten(1)
        if not self.norm_obs:
            return x
        if update:
            self.obs_rms.update(x)
        return ((x - self.obs_rms.mean) / torch.sqrt(self.obs_rms.var + 1e-8)).clamp(-10, 10).float()

    def get_value(self, x):
        return self.critic(x).squeeze(-1)

    def dist(self, x):
        out = self.actor(x)
        return Categorical(logits=out) if self.discrete else Normal(out, self.actor_logstd.exp().expand_as(out))

    def get_action_and_value(self, x, action=None, greedy=False):
        d = self.dist(x)
        if action is None:
            action = (d.probs.argmax(-1) if self.discrete else d.mean) if greedy else d.sample()
        if self.discrete:
            return action, d.log_prob(action), d.entropy(), self.get_value(x)
        return action, d.log_prob(action).sum(-1), d.entropy().sum(-1), self.get_value(x)


def to_env(action, space):
    """Torch actions -> what env.step takes; Gaussian samples are clipped to the Box."""
    a = action.cpu().numpy()
    return a if isinstance(space, gym.spaces.Discrete) else np.clip(a, space.low, space.high).astype(space.dtype)


def acting(agent, action_space, device) -> MakePolicy:
    """`(num_envs, rng) -> act(obs, done) -> actions`: the most probable action, or the Gaussian's mean (the
    evaluations)."""

    def act_fn(obs, done):
        return to_env(agent.get_action_and_value(agent.preprocess(obs, device), greedy=True)[0], action_space)

    return lambda num_envs, rng: act_fn


NETWORK_FLAGS = ("hidden_size",)  # what a checkpoint's weights depend on (--norm-obs travels as a buffer)


def main(args):
    args.batch_size = args.num_envs * args.num_steps
    check_args(
        args,
        (
            args.num_minibatches <= args.batch_size,
            f"--num-minibatches {args.num_minibatches} exceeds "
            f"the rollout's {args.batch_size} samples (--num-envs x --num-steps)",
        ),
        (
            args.total_timesteps >= args.batch_size,
            f"--total-timesteps {args.total_timesteps} is less than one "
            f"rollout (--num-envs x --num-steps = {args.batch_size})",
        ),
    )
    args.minibatch_size, args.num_iterations = (
        args.batch_size // args.num_minibatches,
        args.total_timesteps // args.batch_size,
    )
    device, rng = setup(args)
    env = make_gym_env(args, args.num_envs, args.seed)
    action_space = env.single_action_space
    agent = Agent(int(np.prod(env.single_observation_space.shape)), action_space, args).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    make_greedy = acting(agent, action_space, device)  # evaluation: the most probable action, or the mean
    run = Run(
        args,
        ALGO,
        env,
        {"agent": agent},
        {"agent": optimizer},
        rng,
        make_greedy,
        network_flags=NETWORK_FLAGS,
        same_flags=("num_steps",),
    )
    writer, global_step, start = run.writer, run.global_step, run.counters.get("iteration", 0) + 1
    discrete = isinstance(action_space, gym.spaces.Discrete)
    rb = RolloutBuffer(
        args.num_steps,
        args.num_envs,
        {
            "obs": (
                (int(np.prod(env.single_observation_space.shape)),),
                np.float32,
            ),  # preprocessed, as the nets see it
            "actions": ((), np.int64) if discrete else (action_space.shape, np.float32),  # unclipped samples
            "logprobs": ((), np.float32),
            "values": ((), np.float32),
            "rewards": ((), np.float32),
            "terminated": ((), np.bool_),
            "truncated": ((), np.bool_),
            "final_values": ((), np.float32),  # V(final observation) where an episode was truncated
        },
    )
    raw_obs, _ = env.reset()
    obs = agent.preprocess(raw_obs, device, update=True)
    discounted = np.zeros(args.num_envs)  # running discounted return, for --norm-reward
    with run:
        for iteration in range(start, args.num_iterations + 1):
            lr = args.learning_rate * (1.0 - (iteration - 1.0) / args.num_iterations if args.anneal_lr else 1.0)
            optimizer.param_groups[0]["lr"] = lr

            for _ in range(args.num_steps):
                # ACT
                with torch.no_grad():
                    action, logprob, _, value = agent.get_action_and_value(obs)
                # STEP
                raw_obs, rewards, terminated, truncated, infos = env.step(to_env(action, action_space))
                global_step += args.num_envs
                if args.norm_reward:  # Gymnasium's NormalizeReward, restarted at every episode end
                    discounted = discounted * args.gamma + rewards
                    agent.return_rms.update(torch.as_tensor(discounted))
                    rewards = np.clip(rewards / np.sqrt(agent.return_rms.var.item() + 1e-8), -10, 10)
                    discounted[terminated | truncated] = 0.0
                # STORE: a truncated episode bootstraps from V(final observation), not the next episode's first
                final_values = np.zeros(args.num_envs, dtype=np.float32)
                if cut := np.flatnonzero(truncated & infos.get("_final_obs", False)).tolist():
                    final = np.stack([infos["final_obs"][i] for i in cut])
                    with torch.no_grad():
                        final_values[cut] = agent.get_value(agent.preprocess(final, device)).cpu().numpy()
                rb.add(
                    obs=obs.cpu().numpy(),
                    actions=action.cpu().numpy(),
                    logprobs=logprob.cpu().numpy(),
                    values=value.cpu().numpy(),
                    rewards=rewards,
                    terminated=terminated,
                    truncated=truncated,
                    final_values=final_values,
                )
                run.log_episodes(infos, global_step)
                obs = agent.preprocess(raw_obs, device, update=True)

            # TARGETS: GAE (Schulman et al. 2016) over the rollout
            with torch.no_grad():
                last_values = agent.get_value(obs).cpu().numpy()
            rb.compute_gae(last_values, args.gamma, args.gae_lambda)
            # UPDATE
            losses = update(agent, optimizer, rb, args, device, rng)
            rb.reset()

            # LOG, then EVAL and checkpoints (run.step: also where Ctrl-C stops the run, between two updates)
            for k, v in losses.items():
                writer.add_scalar(f"losses/{k}", v, global_step)
            writer.add_scalar("charts/SPS", run.sps(global_step), global_step)
            writer.add_scalar("charts/learning_rate", lr, global_step)
            run.step(global_step, iteration=iteration)
    run.finish()
    env.close()


# --- what the loop calls: the PPO update ---


def update(agent, optimizer, rb, args, device, rng):
    """PPO epochs: clipped surrogate, clipped value loss, entropy bonus (CleanRL's ppo.py)."""
    clipfracs = []
    for _ in range(args.update_epochs):
        for mb in rb.minibatches(args.num_minibatches, rng):
            mb = to_torch(mb, device)
            _, logprob, entropy, new_v = agent.get_action_and_value(mb["obs"], mb["actions"])
            logratio = logprob - mb["logprobs"]
            ratio = logratio.exp()
            with torch.no_grad():
                approx_kl = ((ratio - 1) - logratio).mean()  # the k3 estimator (Schulman's blog)
                clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean().item())
            adv = mb["advantages"]
            if args.norm_adv:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()

            v_loss = (new_v - mb["returns"]) ** 2
            if args.clip_vloss:
                v_clipped = mb["values"] + (new_v - mb["values"]).clamp(-args.clip_coef, args.clip_coef)
                v_loss = torch.max(v_loss, (v_clipped - mb["returns"]) ** 2)
            v_loss = 0.5 * v_loss.mean()
            ent = entropy.mean()
            loss = pg_loss - args.ent_coef * ent + args.vf_coef * v_loss
            check_finite(
                loss,
                "the loss",
                "lower --learning-rate, or try --norm-obs / --norm-reward",
                policy=pg_loss,
                value=v_loss,
            )
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
        if args.target_kl is not None and approx_kl > args.target_kl:
            break
    ret, val = rb.targets["returns"], rb["values"]
    explained_var = 0.0 if np.var(ret) == 0 else float(1 - np.var(ret - val) / np.var(ret))
    return dict(
        policy_loss=pg_loss.item(),
        value_loss=v_loss.item(),
        entropy=ent.item(),
        approx_kl=approx_kl.item(),
        clipfrac=float(np.mean(clipfracs)),
        explained_variance=explained_var,
    )


if __name__ == "__main__":
    cli(Args, main)
