"""Bad inputs that once slipped through (issue 44): each now ends in one `error:` line naming the problem, before any
work, or does the right thing. The results tools' cases are in test_results.py."""

import pytest
import script_runs

from runtime import linear_schedule

QUICK = ["--num-envs", "2", "--total-timesteps", "64", "--eval-interval", "0", "--final-eval-episodes", "0",
         "--eval-episodes", "1"]  # fmt: skip


def refusal(capsys, tmp_path, algo, *flags):
    code, _, stderr = script_runs.run_inline(capsys, algo, *QUICK, *flags, "--run-dir", tmp_path / "r", check=False)
    assert code == 2 and "Traceback" not in stderr, stderr[-2000:]
    assert not (tmp_path / "r").exists()  # refused before any work
    return stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "algo, flags, message",
    [
        ("vdn", ["--env-kwargs", '{"bogus": 1}'], "simple_spread_v3 got unexpected argument(s) bogus; it accepts: N,"),
        ("wqmix", ["--central-mixing-embed-dim", "-5"], "--central-mixing-embed-dim -5 must be a positive integer"),
        ("wqmix", ["--central-mixing-embed-dim", "0"], "--central-mixing-embed-dim 0 must be a positive integer"),
        ("vdn", ["--seq-len", "100"], "--seq-len 100 is longer than simple_spread_v3's episodes (at most 25 steps)"),
        ("iql", ["--tau", "0", "--target-network-frequency", "200"], "--tau 0.0 must be > 0"),
        ("coma", ["--max-cycles", "-5"], "--max-cycles -5 must be a positive integer"),
        ("iql", ["--max-cycles", "0", "--max-episode-len", "30"], "--max-cycles 0 must be a positive integer"),
        ("masac", ["--no-autotune", "--target-entropy", "-3"], "--no-autotune keeps it fixed"),
        ("isac", ["--no-autotune", "--alpha-lr", "0.01"], "--no-autotune keeps it fixed"),
        ("maddpg", ["--gumbel-temperature", "0"], "--gumbel-temperature 0.0 must be > 0"),
        # an id of the other kind, or the package's own id: told what to run, not given the list of every id
        ("mappo", ["--env-id", "CartPole-v1"], "'CartPole-v1' is a single-agent Gymnasium id: train it with algos/"),
        ("ppo", ["--env-id", "simple_spread_v3", "--num-steps", "32"], "'simple_spread_v3' is a multi-agent env of"),
        ("qmix", ["--env-id", "Foraging-8x8-2p-2f-coop-v3"], "the task without its version: 'Foraging-8x8-2p-2f-coop'"),
    ],
    ids=lambda x: x if isinstance(x, str) and " " not in x else None,
)
def test_a_bad_flag_is_refused_in_one_line(algo, flags, message, capsys, tmp_path):
    assert message in refusal(capsys, tmp_path, algo, *flags)


def test_a_checkpoint_plays_only_the_env_it_was_trained_on(capsys, tmp_path):
    """Its env flags (here --max-cycles; a battle checkpoint's --map-size) once went into the other env."""
    script_runs.run_inline(capsys, "iql", *QUICK, "--env", "simple_v3", "--max-cycles", "10", "--run-dir", tmp_path)
    code, _, stderr = script_runs.run_inline(capsys, "iql", "--eval-checkpoint", tmp_path / "last.pt", "--env",
                                             "simple_spread_v3", check=False)  # fmt: skip
    assert code == 2 and "Traceback" not in stderr
    assert f"{tmp_path / 'last.pt'} was trained on simple_v3, not simple_spread_v3: drop --env-id" in stderr


def test_resume_names_the_run_directory_when_given_its_checkpoint(capsys, tmp_path):
    script_runs.run_inline(capsys, "iql", *QUICK, "--run-dir", tmp_path / "r")
    code, _, stderr = script_runs.run_inline(capsys, "iql", "--resume", tmp_path / "r" / "last.pt", check=False)
    assert code == 2 and "Traceback" not in stderr  # it said "no such run directory"
    assert f"--resume {tmp_path / 'r' / 'last.pt'}: a file; --resume takes the run directory that holds last.pt " \
           f"(--resume {tmp_path / 'r'})" in stderr  # fmt: skip


def test_an_exploration_schedule_may_rise():
    """qmix --start-e 0 --end-e 1 --exploration-fraction 1 once explored at 1.0 from the first step."""
    assert [linear_schedule(0.0, 1.0, 100, t) for t in (0, 50, 100, 200)] == [0.0, 0.5, 1.0, 1.0]
    assert [linear_schedule(1.0, 0.05, 100, t) for t in (0, 100, 200)] == pytest.approx([1.0, 0.05, 0.05])
    slope = (0.05 - 1.0) / 100  # the falling schedule is CleanRL's expression, to the bit
    assert linear_schedule(1.0, 0.05, 100, 37) == max(slope * 37 + 1.0, 0.05)


@pytest.mark.parametrize(
    "algo, flag, value, choices",
    [("dcg", "--graph", "tree", "'full', 'line', 'cycle', 'star', 'none'"), ("mfq", "--mean-over", "nearest", None),
     ("mfac", "--mean-over", "nearest", None), ("vdac", "--mixer", "qmix", "'sum', 'mix'"),
     ("wqmix", "--weighting", "max", "'ow', 'cw'"), ("mappo", "--backend", "jax", None)],
)  # fmt: skip
def test_a_choice_flag_lists_its_choices_in_help_and_refuses_others(algo, flag, value, choices, capsys):
    """Choice flags are Literals: --help lists the choices, and the parser refuses another value in its own box."""
    _, stdout, _ = script_runs.run_inline(capsys, algo, "--help", check=False)
    assert f"{flag} {{" in stdout  # e.g. --graph {full,line,cycle,star,none}
    code, _, stderr = script_runs.run_inline(capsys, algo, flag, value, check=False)
    assert code == 2 and "Traceback" not in stderr
    assert f"invalid choice '{value}' for argument '{flag}'" in " ".join(stderr.replace("│", " ").split())
    if choices:
        assert choices in " ".join(stderr.replace("│", " ").split())
