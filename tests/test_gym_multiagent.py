"""Level-Based Foraging and the Multi-Robot Warehouse behind our interface (envs/gym_multiagent.py, foraging.py,
warehouse.py, grid_render.py): the benchmark's tasks and any other the packages register build, each step is the
package's own, the time limit is a truncation, and a video's frames show the package's state."""

import re

import gymnasium
import numpy as np
import pytest
from pettingzoo.test import parallel_api_test
from script_runs import run_inline

import envs
from envs import foraging, warehouse
from envs.registry import EnvArgumentError, build_parallel_env

TASKS = [*foraging.TASKS, *warehouse.TASKS]


@pytest.mark.parametrize("task", TASKS)
def test_every_benchmark_task_builds_one_team_and_passes_the_parallel_api_test(task):
    env = envs.make(task, 2, 0)
    ((name, spec),) = env.groups.items()
    if task.startswith("Foraging"):
        players, foods = (int(x) for x in foraging.TASK.fullmatch(task).group("players", "foods"))
        assert (spec.n_agents, spec.obs_shape, spec.action_dim) == (players, (3 * (foods + players),), 6)
    else:
        assert spec.action_dim == 5 and spec.n_agents == int(task.split("-")[-1][:-2])
    assert name == "agent" and env.state_shape == (spec.n_agents * spec.obs_shape[0],)
    env.close()
    parallel_api_test(build_parallel_env(task), num_cycles=60)


def _package_env(task):
    if task.startswith("Foraging"):
        import lbforaging  # noqa: F401

        return gymnasium.make(f"{task}-v3").unwrapped
    import rware  # noqa: F401

    return gymnasium.make(f"{task}-v2").unwrapped


@pytest.mark.parametrize("task", ["Foraging-2s-10x10-3p-3f", "Foraging-10x10-3p-3f", "rware-tiny-2ag"])
def test_every_step_is_the_packages_own_and_the_time_limit_is_a_truncation(task):
    ours, theirs = build_parallel_env(task), _package_env(task)
    rng = np.random.default_rng(0)
    for episode in range(3 if task.startswith("Foraging") else 1):
        obs, _ = ours.reset(seed=episode)
        ref, _ = theirs.reset(seed=episode)
        for t in range(1, 1000):
            assert all(np.array_equal(obs[a], np.asarray(r, np.float32)) for a, r in zip(ours.agents, ref, strict=True))
            actions = {a: int(rng.integers(ours.action_space(a).n)) for a in ours.agents}
            obs, rewards, terminated, truncated, _ = ours.step(actions)
            ref, ref_rewards, done, _, _ = theirs.step([actions[a] for a in actions])
            assert list(rewards.values()) == [float(r) for r in ref_rewards]
            ended = next(iter(terminated.values())) or next(iter(truncated.values()))
            assert ended == done
            if done:
                cleared = task.startswith("Foraging") and theirs.field.sum() == 0
                assert next(iter(terminated.values())) == cleared and next(iter(truncated.values())) == (not cleared)
                assert cleared or t == ours.max_cycles
                break


def test_collecting_every_food_terminates_and_the_time_limit_truncates():
    env = build_parallel_env("Foraging-8x8-2p-2f-coop", max_cycles=5)
    env.reset(seed=0)
    lbf = env.env
    lbf.field[:] = 0
    lbf.field[3, 3] = 2  # one food, the two level-1 players beside it
    for player, cell in zip(lbf.players, [(3, 2), (3, 4)], strict=True):
        player.position, player.level = cell, 1
    lbf._food_spawned = 2.0
    lbf._gen_valid_moves()
    _, rewards, terminated, truncated, _ = env.step({"agent_0": 5, "agent_1": 5})  # both load
    assert sum(rewards.values()) == pytest.approx(1.0)  # the team's total is 1 when all food is collected
    assert all(terminated.values()) and not any(truncated.values()) and env.agents == []
    env.reset(seed=0)
    for _ in range(5):
        _, _, terminated, truncated, _ = env.step({a: 0 for a in env.agents})
    assert all(truncated.values()) and not any(terminated.values())


def test_an_argument_the_task_does_not_take_is_refused_by_name_and_max_cycles_passes_through():
    with pytest.raises(EnvArgumentError, match="unexpected argument.*task.*accepts: max_cycles, render_mode"):
        envs.make("rware-tiny-2ag", 1, 0, task="rware-tiny-4ag")
    assert build_parallel_env("rware-tiny-2ag", max_cycles=7).env.max_steps == 7
    with pytest.raises(ValueError, match="not a Level-Based Foraging task name"):
        foraging.task_kwargs("Foraging-8x9-2p-2f")


def test_our_formula_builds_every_foraging_task_lbforaging_registers_with_its_arguments():
    import lbforaging  # noqa: F401  (registers the ids)

    registered = [s for s in gymnasium.registry.values() if s.id.startswith("Foraging") and "grid" not in s.id]
    assert len(registered) == 15 * 8 * 4 * 2 * 2  # sizes 5-19, 2-9 players, 1-4 foods, -coop, -2s
    for spec in registered:
        task = spec.id.removesuffix("-v3")
        assert {**foraging.task_kwargs(task), "max_episode_steps": 50} == spec.kwargs, task
        assert envs.lookup(task).family == "lbf"


@pytest.mark.parametrize("task", ["Foraging-5x5-2p-1f", "Foraging-2s-19x19-9p-4f-coop", "rware-medium-1ag",
                                  "rware-large-19ag-easy"])  # fmt: skip
def test_a_task_outside_the_benchmarks_builds_by_name_on_the_port_and_the_package_alike(task):
    ported, package = envs.make(task, 2, 0, backend="auto"), envs.make(task, 2, 0, backend="pettingzoo")
    assert type(ported).__module__ in ("envs.foraging_numba", "envs.warehouse_numba")
    assert ported.groups == package.groups and ported.state_shape == package.state_shape
    ported.close(), package.close()


@pytest.mark.parametrize(
    "task, says",
    [
        ("Foraging-4x4-2p-1f", r"'Foraging-4x4-2p-1f' is outside .* with S 5-19, P 2-9, F 1-5"),
        ("Foraging-8x8-2p-6f", r"with S 5-19, P 2-9, F 1-5"),
        ("Foraging-8x8-10p-2f", r"with S 5-19, P 2-9, F 1-5"),
        ("rware-tiny-20ag", r"'rware-tiny-20ag' is not a task rware 2.0.0 registers: .* with N 1-19"),
        ("rware-huge-2ag", r"unknown env id 'rware-huge-2ag'(.|\n)*or any rware-<tiny\|small\|medium\|large>"),
    ],
)
def test_a_task_the_packages_do_not_build_is_refused_with_the_range_they_do(task, says, tmp_path, capsys):
    with pytest.raises(envs.UnknownEnvError, match=says):
        envs.make(task, 1, 0)
    code, _, err = run_inline(capsys, "iql", "--env-id", task, "--run-dir", tmp_path, check=False)
    assert code == 2 and "Traceback" not in err and re.search(says, err)


@pytest.mark.parametrize("algo", ["ippo", "qmix"])
def test_a_script_trains_on_foraging_and_evaluates_on_the_package(algo, tmp_path, capsys):
    flags = ["--env-id", "Foraging-2s-8x8-2p-2f-coop", "--num-envs", 2, "--total-timesteps", 400, "--eval-interval",
             200, "--eval-episodes", 2, "--final-eval-episodes", 4, "--run-dir", tmp_path]  # fmt: skip
    if algo == "qmix":
        flags += ["--learning-starts", 100, "--batch-size", 4]
    _, out, _ = run_inline(capsys, algo, *flags)
    assert "done: 400 steps" in out and (tmp_path / "final_eval.json").exists()


def _colours(frame, rows, cols, inner):
    """The colour of every cell of a grid frame at the pixel `inner` of the cell (inside its lines)."""
    from envs.grid_render import CELL

    return {(r, c): tuple(int(x) for x in frame[r * CELL + 1 + inner[0], c * CELL + 1 + inner[1]])
            for r in range(rows) for c in range(cols)}  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_foraging_frame_draws_every_food_and_player_where_the_package_has_them(seed):
    from envs import grid_render as draw

    env = build_parallel_env("Foraging-2s-10x10-3p-3f")
    env.reset(seed=seed)
    for _ in range(seed * 5):
        env.step({a: int(env.action_space(a).sample()) for a in env.agents})
    frame, lbf = env.render(), env.env
    assert frame.shape == (10 * draw.CELL + 1, 10 * draw.CELL + 1, 3) and frame.dtype == np.uint8
    cells = [(r, c) for r in range(10) for c in range(10)]
    seen = {(r, c) for p in lbf.players for r, c in cells if max(abs(r - p.position[0]), abs(c - p.position[1])) <= 2}
    expected = {cell: draw.WHITE if cell in seen else draw.UNSEEN for cell in cells}
    assert draw.UNSEEN in expected.values()  # sight 2 on a 10 x 10 field: three players never see it all
    expected |= {(int(r), int(c)): draw.FOOD for r, c in zip(*np.nonzero(lbf.field), strict=True)}
    players = {tuple(int(x) for x in p.position): draw.PALETTE[i] for i, p in enumerate(lbf.players)}
    corners, tops = _colours(frame, 10, 10, (2, 2)), _colours(frame, 10, 10, (5, 5))  # a food's square, a disc
    assert {cell: tops[cell] if cell in players else corners[cell] for cell in expected} == expected | players


@pytest.mark.parametrize("task", ["rware-tiny-4ag", "rware-small-4ag"])
def test_a_warehouse_frame_draws_goals_shelves_requests_and_robots_where_the_package_has_them(task):
    from envs import grid_render as draw

    env = build_parallel_env(task)
    env.reset(seed=0)
    for _ in range(40):
        env.step({a: int(env.action_space(a).sample()) for a in env.agents})
    wh = env.env
    loaded, shelf = wh.agents[0], wh.shelfs[0]  # a robot under its shelf, as after a load
    if loaded.carrying_shelf is None and not any(a.carrying_shelf is shelf for a in wh.agents):
        loaded.carrying_shelf, shelf.x, shelf.y = shelf, loaded.x, loaded.y
    frame, rows, cols = env.render(), *wh.grid_size
    requested = {(int(s.y), int(s.x)) for s in wh.request_queue}
    expected = {(r, c): draw.WHITE for r in range(rows) for c in range(cols)}
    expected |= {(int(y), int(x)): draw.GOAL for x, y in wh.goals}
    expected |= {(int(s.y), int(s.x)): draw.REQUESTED if (s.y, s.x) in requested else draw.SHELF for s in wh.shelfs}
    robots = {(int(a.y), int(a.x)): draw.LOADED if a.carrying_shelf else draw.ROBOT for a in wh.agents}
    corners, tops = _colours(frame, rows, cols, (2, 2)), _colours(frame, rows, cols, (5, 5))
    assert {cell: tops[cell] if cell in robots else corners[cell] for cell in expected} == expected | robots
    assert draw.LOADED in robots.values() and draw.REQUESTED in expected.values()


def test_capture_video_films_the_grid_worlds_and_refuses_an_env_without_a_picture_before_training(tmp_path, capsys):
    import imageio.v2 as imageio

    path, stats = envs.record_episode("rware-tiny-2ag", lambda o: {"agent": np.ones((1, 2), np.int64)},
                                      tmp_path / "rware.mp4", max_cycles=5)  # fmt: skip
    with imageio.get_reader(path) as reader:
        frames = [f for f in reader]  # list() would ask the reader its length: infinite
    assert stats.length == 5 and len(frames) == 6 and frames[0].shape == (266, 242, 3)  # padded to even sizes
    flags = ["--total-timesteps", 200, "--eval-interval", 100, "--eval-episodes", 1, "--final-eval-episodes", 1,
             "--capture-video"]  # fmt: skip
    lbf = ["--env-id", "Foraging-8x8-2p-2f-coop", "--num-envs", 2, "--run-dir", tmp_path / "lbf"]
    run_inline(capsys, "ippo", *lbf, *flags)
    assert sorted(p.name for p in (tmp_path / "lbf" / "videos").iterdir()) == ["step_100.mp4", "step_200.mp4"]
    code, _, err = run_inline(capsys, "iql", "--env-id", "matrix_climbing", *flags, "--run-dir", tmp_path / "m",
                              check=False)  # fmt: skip
    assert code == 2 and "Traceback" not in err and "matrix_climbing has no picture: leave out --capture-video" in err
    assert not (tmp_path / "m").exists()  # refused before the run directory was made
