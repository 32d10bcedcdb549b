"""COMA (Foerster et al. 2018, arXiv:1705.08926); results: results/simple_spread_v3/coma.json"""

import copy
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from buffers import RolloutBuffer, float_tensor, to_torch
from runtime import (
    MakePolicy,
    MultiAgentArgs,
    Run,
    adam,
    check_args,
    check_discrete,
    check_finite,
    checkpoint_args,
    cli,
    gru_sequence,
    linear_schedule,
    make_env,
    reset_finished,
    setup,
)

ALGO = "coma"
CONTINUOUS = "mappo.py, ippo.py, maddpg.py, matd3.py or iddpg.py"  # the scripts for continuous actions


@dataclass
class Args(MultiAgentArgs):  # --env-id, --seed, --total-timesteps, --num-envs, evaluation, checkpoints: runtime/args.py
    num_envs: int = 16
    """parallel training envs: COMA's actors take one step per rollout, so smaller rollouts mean more of them
    (16 learned faster than 128: results/simple_spread_v3/coma_tuning.md)"""

    # --- COMA (each learning group: decentralized actors sharing one network, one centralized critic) ---
    actor_lr: float = 5e-4
    """Adam learning rate of the actors"""
    critic_lr: float = 5e-4
    """Adam learning rate of the critic"""
    num_steps: int = 25
    """steps per env per rollout"""
    gamma: float = 0.95
    """discount; 0.95 for 25-step MPE episodes, as in mappo.py"""
    td_lambda: float = 0.8
    """lambda of the critic's TD(lambda) targets (the paper's 0.8)"""
    critic_updates: int = 4
    """critic gradient steps on each rollout, before the actors' one step"""
    target_network_frequency: int = 10_000
    """env steps between copies of the critic into the target critic"""
    start_e: float = 0.5
    """epsilon floor mixed into the policy at the start: (1 - e) softmax + e uniform over the available actions"""
    end_e: float = 0.01
    """epsilon floor at the end of its linear decay"""
    exploration_fraction: float = 0.01
    """fraction of --total-timesteps over which the epsilon floor decays from --start-e to --end-e"""
    ent_coef: float = 0.0
    """entropy bonus weight in the actors' loss; the paper has none. It weighs against the advantages, on the rewards'
    scale: EPyMARL's COMA uses 0.001 on standardised rewards, but on Foraging-8x8-2p-2f-coop's raw ones (mean |A|
    about 0.002) 0.001 holds the policy uniform (results/epymarl_benchmark.md)"""
    actor_adam_eps: float = 1e-8
    """Adam's epsilon in the actors' optimizer (torch's default), the floor under its step's normalisation: at 1e-8
    advantages of 1e-4 take steps as large as advantages of 1, so on a sparse reward the actors follow the
    critic's noise (on rware-tiny-2ag they sharpen within 300k steps, before any delivery is learned:
    results/epymarl_benchmark.md); at 1e-3 small advantages take small steps (there the sharpening then waits 1-3M
    steps, and still no delivery is learned by 3M)"""
    critic_last_actions: bool = False
    """also give the critic every agent's previous action (one-hot)"""
    rnn: bool = False
    """a GRU cell in the actors (their critic stays feed-forward: it sees the state)"""
    hidden_size: int = 64
    """width of the actors' hidden layers (and GRU)"""
    critic_hidden_size: int = 128
    """width of the critic's hidden layers"""
    max_grad_norm: float = 10.0
    """gradient-norm clip, of actors and critic separately"""

    # --- derived at runtime ---
    batch_size: int = field(default=0, init=False)
    """num_envs x num_steps"""
    num_iterations: int = field(default=0, init=False)
    """total_timesteps // batch_size"""


def with_id(x, n_agents):  # (B, A, d) -> (B, A, d + A): a one-hot agent id, so a shared network tells agents apart
    return torch.cat([x, torch.eye(n_agents, device=x.device).expand(*x.shape[:-1], n_agents)], -1)


class Actor(nn.Module):
    """pi^a(. | tau^a): one network for the group's agents (agent-id one-hot); --rnn: a GRU cell in the middle."""

    def __init__(self, spec, args):
        super().__init__()
        h, self.n_agents = args.hidden_size, spec.n_agents
        self.fc = nn.Linear(int(np.prod(spec.obs_shape)) + spec.n_agents, h)
        self.mid = nn.GRUCell(h, h) if args.rnn else nn.Linear(h, h)
        self.head = nn.Linear(h, spec.action_dim)

    def forward(self, obs, hx=None, keep=None):  # obs (B, A, *obs_shape), hx (B, A, H) or None -> logits (B, A, n), hx
        x = torch.relu(self.fc(with_id(obs.flatten(2), self.n_agents)))
        if hx is None:
            return self.head(torch.relu(self.mid(x))), None
        if keep is not None:  # (T, E): B = T*E rows, time-major; every step's state, the recurrence in one call
            gx, m = F.linear(x, self.mid.weight_ih, self.mid.bias_ih).unflatten(0, keep.shape), self.mid
            hs = gru_sequence(gx, hx, m.weight_hh.T[None], m.bias_hh.view(1, 1, -1), keep).flatten(0, 1)
            return self.head(hs), hs[-len(hx) :]
        B, A = x.shape[:2]
        hx = self.mid(x.reshape(B * A, -1), hx.reshape(B * A, -1)).view(B, A, -1)
        return self.head(hx), hx


class Critic(nn.Module):
    """Q(s, (u^-a, .)) for every own action of agent a, from the state, a's observation, the other agents' actions
    (one-hot), a's id and, with --critic-last-actions, every agent's previous action."""

    def __init__(self, spec, state_dim, args):
        super().__init__()
        A, n, h = spec.n_agents, spec.action_dim, args.critic_hidden_size
        self.n_agents, self.n_actions, self.last_actions = A, n, args.critic_last_actions
        d = state_dim + int(np.prod(spec.obs_shape)) + A * n + A + (A * n if args.critic_last_actions else 0)
        self.net = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, n))

    def forward(self, state, obs, actions, alive, last_actions=None):
        """state (B, S), obs (B, A, *obs_shape), actions, alive, last_actions (B, A; n: none) -> Q (B, A, n)."""
        return self.net(self.inputs(state, obs, actions, alive, last_actions))

    def inputs(self, state, obs, actions, alive, last_actions=None):  # -> every agent's input row (B, A, d)
        B, A, n = *actions.shape, self.n_actions
        joint = (F.one_hot(actions, n) * alive[..., None]).view(B, 1, A * n).float()  # dead agents act no action
        others = joint * (1 - torch.eye(A, device=joint.device)).repeat_interleave(n, 1)  # (B, A, A n): own one zeroed
        parts = [state.flatten(1)[:, None].expand(B, A, -1), obs.flatten(2), others]
        if self.last_actions:
            parts.append(F.one_hot(last_actions, n + 1)[..., :n].reshape(B, 1, A * n).expand(B, A, -1).float())
        return with_id(torch.cat(parts, -1), A)


class Coma(nn.Module):
    """One learning group: its actor, its critic and the target critic."""

    def __init__(self, spec, state_dim, args):
        super().__init__()
        self.spec = spec
        self.actor = Actor(spec, args)
        self.critic = Critic(spec, state_dim, args)
        self.target_critic = copy.deepcopy(self.critic)


def policy_probs(logits, avail, epsilon):
    """(1 - epsilon) softmax(logits) + epsilon uniform, both over the available actions (COMA's exploration floor)."""
    if avail is None:
        return (1 - epsilon) * torch.softmax(logits, -1) + epsilon / logits.shape[-1]
    avail = avail.bool()
    probs = torch.softmax(logits.masked_fill(~avail, -torch.inf), -1)
    return (1 - epsilon) * probs + epsilon * avail / avail.sum(-1, keepdim=True)


def counterfactual_advantages(q_all, pi, actions):
    """A^a = Q(s, u) - sum_a' pi^a(a') Q(s, (u^-a, a')) for every agent at once: q_all and pi (..., A, n), actions
    (..., A). One critic pass gives every own action's value, so the baseline is a dot product, not a loop."""
    return q_all.gather(-1, actions[..., None]).squeeze(-1) - (pi * q_all).sum(-1)


def masked_mean(mask, x):
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


@torch.no_grad()
def act(groups, obs, hidden, epsilon, device, greedy=False):
    """Actions of every group (numpy); `hidden` (group -> the actors' GRU states, or None) is advanced."""
    actions = {}
    for g, coma in groups.items():
        avail = obs.avail_actions.get(g)
        logits, hidden[g] = coma.actor(float_tensor(obs.obs[g], device), hidden[g])
        pi = policy_probs(logits, None if avail is None else torch.as_tensor(avail, device=device), epsilon)
        actions[g] = pi.argmax(-1) if greedy else torch.multinomial(pi.flatten(0, 1), 1).view(pi.shape[:2])
        actions[g] = actions[g].cpu().numpy()
    return actions


def initial_hidden(comas, args, num_envs, device):  # group -> zero GRU states of the actors (None without --rnn)
    return {
        g: torch.zeros(num_envs, c.spec.n_agents, args.hidden_size, device=device) if args.rnn else None
        for g, c in comas.items()
    }


def acting(comas, args, device, greedy=True) -> MakePolicy:
    """`(num_envs, rng) -> act(obs, done) -> actions`: the most probable (or a sampled) action, GRU states reset where
    episodes end (the evaluations, and a checkpoint playing a group: `actor`)."""

    def make(num_envs, rng):
        hidden = initial_hidden(comas, args, num_envs, device)

        def act_fn(obs, done):
            nonlocal hidden
            hidden = reset_finished(hidden, done)
            return act(comas, obs, hidden, 0.0, device, greedy)

        return act_fn

    return make


def actor(ckpt, group, spec, device, greedy=True) -> MakePolicy:
    """Group `group` of a checkpoint as an actor: --opponent, --self-play, results/tournament.py (runtime.opponents)."""
    args = checkpoint_args(Args, ckpt["args"])
    coma = Coma(spec, int(np.prod(ckpt["signature"]["state_shape"])), args).to(device)
    coma.load_state_dict(ckpt["nets"][group])
    return acting({group: coma}, args, device, greedy)


def make_optimizers(comas, learners, args):
    """runtime's (fused) Adam for each learning group's actors and its critic: `<group>_actor`, `<group>_critic`."""
    return {
        f"{g}_{part}": adam(getattr(comas[g], part).parameters(), lr, eps=eps)
        for g in learners
        for part, lr, eps in (("actor", args.actor_lr, args.actor_adam_eps), ("critic", args.critic_lr, 1e-8))
    }


NETWORK_FLAGS = ("hidden_size", "critic_hidden_size", "rnn", "critic_last_actions")  # what the weights depend on


def main(args):
    args.batch_size = args.num_envs * args.num_steps
    check_args(
        args,
        (
            args.total_timesteps >= args.batch_size,
            f"--total-timesteps {args.total_timesteps} is less "
            f"than one rollout (--num-envs x --num-steps = {args.batch_size})",
        ),
    )
    args.num_iterations = args.total_timesteps // args.batch_size
    device, rng = setup(args)
    env = make_env(args, args.num_envs, args.seed)
    check_discrete(args, env, ALGO, CONTINUOUS)
    learners = list(env.groups)  # the learning groups: make_env acts for the frozen ones
    state_dim = int(np.prod(env.state_shape))
    comas = {g: Coma(spec, state_dim, args).to(device) for g, spec in env.groups.items()}
    optimizers = make_optimizers(comas, learners, args)

    make_greedy = acting(comas, args, device)  # evaluation: the most probable action
    run = Run(
        args, ALGO, env, comas, optimizers, rng, make_greedy, network_flags=NETWORK_FLAGS, same_flags=("num_steps",)
    )
    writer, global_step, start = run.writer, run.global_step, run.counters.get("iteration", 0) + 1
    buffers = {
        g: RolloutBuffer(args.num_steps, args.num_envs, rollout_fields(env.groups[g], env.state_shape, args))
        for g in learners
    }
    last_actions = {g: np.full((args.num_envs, spec.n_agents), spec.action_dim) for g, spec in env.groups.items()}
    hidden, starts = initial_hidden(comas, args, args.num_envs, device), np.ones(args.num_envs, bool)
    # what the loop carries (--resume: from last.pt, with the env's state; the next step's actions, chosen already)
    obs, hidden, starts, last_actions, actions, stored_hidden = run.begin(
        env.reset(), hidden=hidden, starts=starts, last_actions=last_actions, actions=None, stored_hidden=None
    )
    unset = {g: np.zeros((args.num_envs, spec.n_agents), np.float32) for g, spec in env.groups.items()}  # values
    epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step)
    if actions is None:  # the first step's actions
        stored_hidden = {g: None if h is None else h.cpu().numpy() for g, h in hidden.items()}
        actions = act(comas, obs, hidden, epsilon, device)
    with run:
        for iteration in range(start, args.num_iterations + 1):
            for _ in range(args.num_steps):
                # STEP with the actions chosen after the last step (the bootstrap of a rollout needs them too)
                step = env.step(actions)
                global_step += args.num_envs
                epsilon = linear_schedule(
                    args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
                )
                # a finished episode's final joint action, drawn from the policy: Q'(s_T, u_T) bootstraps a truncation
                final_actions = (
                    act(comas, step.final, dict(hidden), epsilon, device) if (step.done.any()) else actions
                )  # unused where no episode ended: no second actor pass
                # STORE
                for g in learners:
                    avail = {"avail_actions": obs.avail_actions[g]} if g in obs.avail_actions else {}
                    rnn = {"h_actor": stored_hidden[g], "starts": starts} if args.rnn else {}
                    buffers[g].add(
                        obs=obs.obs[g],
                        state=obs.state,
                        actions=actions[g],
                        last_actions=last_actions[g],
                        rewards=step.rewards[g],
                        terminated=step.terminated[g],
                        truncated=step.truncated,
                        agent_mask=obs.agent_mask[g],
                        final_obs=step.final.obs[g],
                        final_state=step.final.state,
                        final_actions=final_actions[g],
                        final_mask=step.final.agent_mask[g],
                        values=unset[g],
                        final_values=unset[g],
                        **avail,
                        **rnn,
                    )
                for g, spec in env.groups.items():
                    last_actions[g] = np.where(step.done[:, None], spec.action_dim, actions[g])  # "none" at a start
                hidden = reset_finished(hidden, step.done)  # the next episodes start from zero
                starts = step.done
                run.log_episodes(step.episodes, global_step)
                obs = step.next
                # ACT for the next step
                stored_hidden = {g: None if h is None else h.cpu().numpy() for g, h in hidden.items()}
                actions = act(comas, obs, hidden, epsilon, device)

            # TARGETS and UPDATE, group by group
            for g in learners:
                after = {
                    "state": obs.state,
                    "obs": obs.obs[g],
                    "actions": actions[g],
                    "alive": obs.agent_mask[g],
                    "last_actions": last_actions[g],
                }
                out = update(
                    comas[g],
                    optimizers[f"{g}_actor"],
                    optimizers[f"{g}_critic"],
                    buffers[g],
                    after,
                    epsilon,
                    args,
                    device,
                )
                for k, v in out.items():
                    writer.add_scalar(f"losses/{k}" if len(learners) == 1 else f"losses/{k}/{g}", v, global_step)
                buffers[g].reset()
            every = args.target_network_frequency
            if global_step // every > (global_step - args.batch_size) // every:  # a multiple of it was passed
                for g in learners:
                    comas[g].target_critic.load_state_dict(comas[g].critic.state_dict())

            # LOG, then EVAL and checkpoints (run.step: also where Ctrl-C stops the run, between two updates)
            writer.add_scalar("charts/SPS", run.sps(global_step), global_step)
            writer.add_scalar("charts/epsilon", epsilon, global_step)
            carried = dict(hidden=hidden, starts=starts, last_actions=last_actions, actions=actions)
            run.step(global_step, loop=carried | {"stored_hidden": stored_hidden}, iteration=iteration)
    run.finish()
    env.close()


# --- what the loop calls: the rollout declaration, the critic's TD(lambda) targets and the COMA update ---


def rollout_fields(spec, state_shape, args):
    """One group's rollout, declared once: name -> (per-env shape, dtype)."""
    A = spec.n_agents
    fields = {
        "obs": ((A, *spec.obs_shape), np.float32),
        "state": (state_shape, np.float32),
        "actions": ((A,), np.int64),
        "last_actions": ((A,), np.int64),  # the previous step's actions; action_dim at an episode's start
        "rewards": ((A,), np.float32),
        "terminated": ((A,), np.bool_),
        "truncated": ((), np.bool_),
        "agent_mask": ((A,), np.bool_),
        # where an episode ended: its final observation and a joint action drawn there, for the bootstrap
        "final_obs": ((A, *spec.obs_shape), np.float32),
        "final_state": (state_shape, np.float32),
        "final_actions": ((A,), np.int64),
        "final_mask": ((A,), np.bool_),
        "values": ((A,), np.float32),  # Q'(s_t, u_t) and Q'(s_T, u_T), filled in by the update
        "final_values": ((A,), np.float32),
    }
    if spec.has_action_mask:
        fields["avail_actions"] = ((A, spec.action_dim), np.bool_)
    if args.rnn:  # the GRU states each step was acted on, and where episodes began (the states restart)
        fields |= {"h_actor": ((A, args.hidden_size), np.float32), "starts": ((), np.bool_)}
    return fields


def q_taken(critic, state, obs, actions, alive, last_actions):
    """Q(s, u) of the taken joint action for every agent, over any leading (T, E) axes: -> (..., A)."""
    lead = actions.shape[:-1]
    flat = [x.reshape(-1, *x.shape[len(lead) :]) for x in (state, obs, actions, alive, last_actions)]
    q = critic(*flat).view(*lead, *actions.shape[len(lead) :], -1)
    return q.gather(-1, actions[..., None]).squeeze(-1), q


def actor_logits(coma, mb, args):
    """The actors' logits over the rollout (T, E, A, n): one flat pass, or --rnn unrolled from the stored states."""
    T, E = mb["obs"].shape[:2]  # --rnn: restarting where episodes began
    hx, keep = (mb["h_actor"][0], 1 - mb["starts"]) if args.rnn else (None, None)
    return coma.actor(mb["obs"].flatten(0, 1), hx, keep)[0].unflatten(0, (T, E))


def critic_targets(coma, rb, after, args, device):
    """TD(lambda) returns G^lambda (T, E, A) over Q'(s_{t+1}, u_{t+1}) of the target critic, by the compiled kernel;
    after a truncation Q'(s_T, u_T) of the episode's final observation, after the rollout's last step `after`'s."""
    mb, tc = to_torch(rb.data, device), coma.target_critic
    with torch.no_grad():
        values = q_taken(tc, mb["state"], mb["obs"], mb["actions"], mb["agent_mask"], mb["last_actions"])[0]
        final = q_taken(tc, mb["final_state"], mb["final_obs"], mb["final_actions"], mb["final_mask"], mb["actions"])[0]
        a = {k: torch.as_tensor(np.array(v)[None], device=device) for k, v in after.items()}
        boot = q_taken(tc, a["state"].float(), a["obs"].float(), a["actions"], a["alive"], a["last_actions"])[0][0]
    rb["values"][:], rb["final_values"][:] = values.cpu().numpy(), final.cpu().numpy()
    return torch.as_tensor(rb.compute_td_lambda(boot.cpu().numpy(), args.gamma, args.td_lambda), device=device)


def update(coma, actor_opt, critic_opt, rb, after, epsilon, args, device):
    """The critic on TD(lambda) targets of the target critic, then one actor step on the counterfactual advantages."""
    returns = critic_targets(coma, rb, after, args, device)
    mb = to_torch(rb.data, device)
    mask = mb["agent_mask"]  # (T, E, A): a dead agent's steps weigh nothing
    actions, last = mb["actions"], mb["last_actions"]
    # UPDATE the critic: --critic-updates steps of squared error on the taken joint actions
    for _ in range(args.critic_updates):
        q = q_taken(coma.critic, mb["state"], mb["obs"], actions, mask, last)[0]
        critic_loss = masked_mean(mask, (q - returns) ** 2)
        check_finite(critic_loss, f"group {coma.spec.name}: the critic loss", "lower --critic-lr")
        critic_opt.zero_grad()
        critic_loss.backward()
        nn.utils.clip_grad_norm_(coma.critic.parameters(), args.max_grad_norm)
        critic_opt.step()
    # UPDATE the actors: the policy gradient with the counterfactual baseline of the updated critic
    with torch.no_grad():
        q_all = q_taken(coma.critic, mb["state"], mb["obs"], actions, mask, last)[1]
    pi = policy_probs(actor_logits(coma, mb, args), mb.get("avail_actions"), epsilon)
    advantages = counterfactual_advantages(q_all, pi.detach(), actions)
    logp = torch.log(pi.gather(-1, actions[..., None]).squeeze(-1).clamp(min=1e-10))
    policy_loss = -masked_mean(mask, advantages * logp)
    entropy = masked_mean(mask, -(pi * torch.log(pi.clamp(min=1e-10))).sum(-1))
    check_finite(policy_loss, f"group {coma.spec.name}: the policy loss", "lower --actor-lr")
    actor_opt.zero_grad()
    (policy_loss - args.ent_coef * entropy).backward()
    nn.utils.clip_grad_norm_(coma.actor.parameters(), args.max_grad_norm)
    actor_opt.step()
    return dict(
        policy_loss=policy_loss.item(),
        qf_loss=critic_loss.item(),
        entropy=entropy.item(),
        q_values=masked_mean(mask, q).item(),
        advantage=masked_mean(mask, advantages.abs()).item(),
    )


if __name__ == "__main__":
    cli(Args, main)
