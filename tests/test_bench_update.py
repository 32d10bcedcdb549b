"""bench/bench_update.py: the matrix products it counts are all the update's products (so its ceiling is one)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import bench_update  # noqa: E402


def test_products_are_counted_by_shape():
    a, b, c = torch.randn(6, 4), torch.randn(4, 3), torch.randn(3, 5)
    counts = bench_update.products_of(lambda: (a @ b, a @ b, (a @ b) @ c))
    assert counts == {(6, 4, 3): 3, (6, 3, 5): 1}


def test_mappo_update_products_are_forward_and_both_gradients_of_every_layer():
    """6 N d_in d_out FLOPs per layer and epoch: forward, weight gradient, input gradient, for the actor and the
    centralized critic on simple_spread; the first layers need no input gradient (4 N d_in d_out). The critic's first
    layer sees each env's state once (N / 3 rows), not once per agent, and adds its one-hot id's weight row."""
    m = bench_update.load_script("mappo")
    args, pol, opt, rb, rng = bench_update.filled_rollout("mappo", m)
    counts = bench_update.products_of(lambda: m.update(pol, opt, rb, args, "cpu", rng))
    n, h, ids = args.num_envs * args.num_steps * 3, args.hidden_size, 3
    obs, state, actions = 18, 54, 5  # simple_spread_v3 with 3 agents
    first = [(n, obs + ids, h), (n // 3, state, h)]
    upper = [(n, h, h), (n, h, actions), (n, h, h), (n, h, 1)]
    flops = lambda layers: sum(rows * i * o for rows, i, o in layers)  # noqa: E731
    expected = args.update_epochs * (4 * flops(first) + 6 * flops(upper))
    assert sum(2 * mm * k * nn * c for (mm, k, nn), c in counts.items()) == expected


def test_maddpg_update_products_are_those_of_its_four_passes():
    """One MADDPG update at the defaults on simple_spread (one group of 3 agents sharing an actor and a critic fed an
    agent-id one-hot, so 3 x 256 rows): target actor and target critic forward; critic forward, weight gradients and
    the input gradients of its upper layers; actor forward, the critic on the actor's actions with input gradients
    through all its layers (its weights frozen), then the actor's weight gradients and upper input gradients."""
    m = bench_update.load_script("maddpg")
    args, update, per_call = bench_update.filled_replay("maddpg", m, train_frequency=256, batch_size=256)
    counts = bench_update.products_of(update)
    rows, h = 3 * args.batch_size, args.hidden_size
    obs, actions, ids = 18, 5, 3
    actor = [(obs + ids, h), (h, h), (h, actions)]
    critic = [(3 * obs + 3 * actions + ids, h), (h, h), (h, 1)]
    macs = lambda layers: sum(i * o for i, o in layers)  # noqa: E731
    expected = 2 * rows * (3 * macs(actor) + 5 * macs(critic) + macs(critic[1:]) + macs(actor[1:]))
    assert per_call == 1
    assert sum(2 * mm * k * n * c for (mm, k, n), c in counts.items()) == expected


def test_batched_products_count_once_per_matrix():
    a, b, bias = torch.randn(2, 6, 4), torch.randn(2, 4, 3), torch.randn(2, 1, 3)
    counts = bench_update.products_of(lambda: (torch.bmm(a, b), torch.baddbmm(bias, a, b)))
    assert counts == {(6, 4, 3): 4}


def test_compile_bench_starts_every_ddpg_form_from_the_same_update():
    """bench/bench_compile.py checks each compiled form's losses against eager's first update: that only means
    something if a fresh preparation replays the same update (buffer, weights, batch) every time."""
    import bench_compile

    first, again = bench_compile.prepared("maddpg", "eager"), bench_compile.prepared("maddpg", "eager")
    losses = first(reset=True)
    assert set(losses) >= {"qf_loss", "actor_loss"} and all(isinstance(v, float) for v in losses.values())
    assert again(reset=True) == losses
    assert first() != losses  # the next call is the next update
