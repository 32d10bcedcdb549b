"""bench/: the checks of the benchmarks' own logic that need no timing (cuda_check.py on the CPU, bench_battle.py's
agents and ratios); test_bench_update.py and test_bench_fused_mlp.py check what two of them count."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))


def test_cuda_check_trains_and_plays_back_each_checkpoint(tmp_path):
    """bench/cuda_check.py's own path, without a GPU (--cpu): a trained script's last.pt played twice."""
    cmd = [sys.executable, str(BENCH / "cuda_check.py"), "--cpu", "--algos", "dqn,mappo", "--workers", "2",
           "--out", str(tmp_path / "cc")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads((tmp_path / "cc.json").read_text())["rows"]
    assert [r["check"] for r in rows] == ["dqn", "mappo"]
    for r in rows:
        assert r["train_rc"] == 0 and "error" not in r
        assert r["gpu_return"] is not None and r["gpu_return"] == r["cpu_return"]  # both sides on the CPU here
    assert "| mappo |" in (tmp_path / "cc.md").read_text()


def test_cuda_check_refuses_to_run_without_a_device_and_names_the_way_out(monkeypatch, capsys):
    import cuda_check
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    refusals = ((["--algos", "dqn"], "no CUDA device here: run it on a machine with one, or pass --cpu"),
                (["--algos", "dqn,sarsa"], "unknown check"))  # fmt: skip
    for argv, message in refusals:
        monkeypatch.setattr(sys, "argv", ["cuda_check.py", *argv])
        with pytest.raises(SystemExit) as e:
            cuda_check.main()
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err, err


def test_bench_battle_counts_agents_as_magent2_places_them_and_reports_the_gpu_ratio(monkeypatch, capsys):
    import bench_battle
    import torch

    assert [bench_battle.agents_a_side(m) for m in (45, 40)] == [81, 64]
    run = dict(algo="ippo", malloc="heap only", agent_steps_per_s=0, peak_rss_gib=1, hours_for_2m=1, command="c")
    report = dict(date="d", cpu="c", cores=16, gpu="G", workers=4, load_average_before=[0] * 3, load_average=[0] * 3,
                  map_size=40, agents_a_side=64, max_cycles=400, command="x", steps=1,
                  runs=[run | dict(device="cpu", sps=50.0), run | dict(device="G", sps=400.0)])  # fmt: skip
    text = bench_battle.markdown(report)
    assert "40 x 40 (64 agents a side)" in text and "ippo with `--cuda`: **8.0x**" in text
    assert text.startswith("# Training on battle_v4 (40 x 40; ippo; CPU and G): ")  # tells the reports apart
    assert "| ippo | heap only | G | 400.0 |" in text
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["bench_battle.py", "--cuda"])
    with pytest.raises(SystemExit) as e:
        bench_battle.main()
    assert e.value.code == 2 and "--cuda: no CUDA device here" in capsys.readouterr().err


def test_compare_commits_compares_the_steps_both_runs_reached(tmp_path):
    """A slow script stopped after --seconds reaches fewer steps in one run than in the other: the losses they share
    decide (drqn's 118 and 98 points once read as 'differs'); a value that differs there still does."""
    import compare_commits
    from torch.utils.tensorboard import SummaryWriter

    def run(name, values):
        with SummaryWriter(str(tmp_path / name)) as w:
            for step, v in enumerate(values):
                w.add_scalar("losses/td_loss", v, step * 100)
        return tmp_path / name

    long, short = run("long", [1.0, 2.0, 3.0, 4.0]), run("short", [1.0, 2.0, 3.0])
    assert compare_commits.compare(long, short, 10_000) == "identical (1 tags, 3 values, steps <= 200)"
    assert "differs" in compare_commits.compare(long, run("other", [1.0, 2.5, 3.0]), 10_000)


def test_first_step_reads_the_first_sps_and_groups_compiles_by_scenario(tmp_path):
    """bench_first_step.py's readings: the first charts/SPS event's wall time (not a later one's, not another tag's),
    a clear error where a run logged none, and compiled functions put in the part they belong to."""
    from bench_first_step import first_scalar_time, group_of
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "run"))
    writer.add_scalar("charts/episodic_return", -20.0, 25, walltime=100.0)
    writer.add_scalar("charts/SPS", 900.0, 3200, walltime=105.5)
    writer.add_scalar("charts/SPS", 950.0, 6400, walltime=109.0)
    writer.close()
    assert first_scalar_time(tmp_path / "run") == 105.5
    SummaryWriter(str(tmp_path / "empty")).close()
    with pytest.raises(RuntimeError, match="logged no charts/SPS"):
        first_scalar_time(tmp_path / "empty")
    others = "MPE scenarios: the 8 others' functions"
    assert group_of("envs.mpe.scenarios.observe_tag") == others
    assert group_of("envs.mpe.scenarios.reward_speaker_listener") == others
    assert group_of("envs.mpe.scenarios.touched_by_adversaries") == others
    assert group_of("envs.mpe.scenarios._crypto_error") == others
    assert group_of("envs.mpe.scenarios.observe_spread") == "MPE scenarios: simple_spread's, and shared"
    assert group_of("envs.mpe.scenarios.observe") == "MPE scenarios: simple_spread's, and shared"
    assert group_of("envs.mpe.kernels.step_envs") == "MPE kernels and physics"
    assert group_of("buffers.kernels._gae") == "the buffers' kernels (GAE)"
    assert group_of("numba.np.arrayobj.ol_np_zeros.<locals>.impl").startswith("Numba's own")


def test_sweep_cost_reads_the_steady_speed_after_the_start(tmp_path):
    """bench_sweep_cost.py's speed: the env steps from the middle to the last charts/SPS point over their wall times
    (a slow start, such as the replay filling, left out), and a clear error for a run with too few points."""
    from bench_sweep_cost import steady_speed
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "run"))
    for step, wall in [(10_000, 100.0), (20_000, 130.0), (30_000, 131.0), (40_000, 132.0), (50_000, 133.0)]:
        writer.add_scalar("charts/SPS", step / (wall - 90.0), step, walltime=wall)
    writer.close()
    assert steady_speed(tmp_path / "run") == pytest.approx(20_000 / 2.0)  # points 3 and 5 (the middle and the last)
    writer = SummaryWriter(str(tmp_path / "short"))
    writer.add_scalar("charts/SPS", 1.0, 1, walltime=1.0)
    writer.close()
    with pytest.raises(RuntimeError, match="logged 1 charts/SPS points"):
        steady_speed(tmp_path / "short")


def test_every_profiled_phase_of_bench_train_names_a_function_its_file_defines():
    """bench_train's breakdowns add up cProfile's rows by (function, file[:class]): a phase whose function was renamed
    or moved would silently read 0 s, so each must still be defined where the table says (torch's own, "~", aside)."""
    import ast

    import bench_train

    for algo, phases in bench_train.PHASES.items():
        for name, where in phases:
            path, _, cls = where.partition(":")
            if path == "~" or not path.startswith(("algos/", "buffers/", "envs/")):
                continue
            tree = ast.parse((ROOT / path).read_text())
            scope = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None) if cls else tree
            assert scope is not None, f"{algo}: no class {cls} in {path}"
            defs = {n.name for n in ast.walk(scope) if isinstance(n, ast.FunctionDef)}
            assert name in defs, f"{algo}: {name} not defined in {where}"
            if cls:  # method_line finds it where cProfile keys it
                assert bench_train.method_line(ROOT / path, cls, name) > 0


def test_bench_counts_and_script_names_are_checked_as_they_are_parsed(capsys):
    """--repeats 0 ended minutes later in "no median for empty data", --steps 0 in a division by zero or a failed
    run's CalledProcessError, --algos nosuch in a FileNotFoundError: each was a traceback, now one error line."""
    import argparse

    import host

    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=host.positive(int), default=3)
    parser.add_argument("--seconds", type=host.positive(float), default=1.0)
    parser.add_argument("--algos", type=host.scripts, default="mappo")
    for argv, says in ((["--repeats", "0"], "argument --repeats: must be > 0, got 0"),
                       (["--repeats", "2.5"], "argument --repeats: expected a whole number > 0, got '2.5'"),
                       (["--seconds", "-1"], "argument --seconds: must be > 0, got -1"),
                       (["--algos", "mappo,nosuch"], "--algos: no script algos/<name>.py for nosuch (there are:"),
                       (["--algos", ","], "argument --algos: no script algos/<name>.py for ','")):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            parser.parse_args(argv)
        assert e.value.code == 2 and says in capsys.readouterr().err, argv
    args = parser.parse_args(["--repeats", "5", "--seconds", "0.5", "--algos", "mappo,qmix"])
    assert (args.repeats, args.seconds, args.algos) == (5, 0.5, "mappo,qmix")  # the text as given: callers split it
    out = subprocess.run([sys.executable, str(BENCH / "bench_relations.py"), "--rounds", "0"], capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert out.returncode == 2 and "argument --rounds: must be > 0, got 0" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_measured_run_that_fails_ends_the_benchmark_with_its_own_error_line():
    """bench_train/bench_malloc/bench_jaxmarl ended a failed run in a CalledProcessError whose text has the command
    but not the run's reason."""
    import host

    with pytest.raises(SystemExit) as e:
        host.run_or_exit([sys.executable, "-c", "import sys; print('noise'); sys.exit('error: --num-envs 0 must be')"])
    assert str(e.value).startswith("error: ") and str(e.value).endswith("failed (exit 1): error: --num-envs 0 must be")
    assert host.run_or_exit([sys.executable, "-c", "print('ok')"], text=True).stdout == "ok\n"


def test_an_out_that_cannot_be_written_is_refused_before_the_benchmark_measures(tmp_path, capsys):
    """bench_kernels' --out under a file was a NotADirectoryError after its minutes of timing; a probe's --out a
    folder an IsADirectoryError after its episodes. Refused as the flags are parsed now, by the benches, the probes
    and results/run.py alike (host.writable_parent)."""
    import argparse
    import os

    import host

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=host.out_folder)
    parser.add_argument("--report", type=host.out_file)
    for argv, says in ((["--out", f"{blocker}/speed"], f"argument --out: {blocker} is not a folder this user can"),
                       (["--report", f"{blocker}/x/report.md"], f"argument --report: {blocker} is not a folder"),
                       (["--report", str(tmp_path)], f"{tmp_path} is a folder: name a file in it")):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            parser.parse_args(argv)
        assert e.value.code == 2 and says in capsys.readouterr().err, argv
    args = parser.parse_args(["--out", str(tmp_path / "new" / "speed"), "--report", str(tmp_path / "new" / "stem")])
    assert args.out == tmp_path / "new" / "speed" and args.report == str(tmp_path / "new" / "stem")  # made when written
    if os.geteuid() != 0:  # root writes anywhere
        (locked := tmp_path / "locked").mkdir(mode=0o500)
        assert host.writable_parent(locked / "speed") == locked
    for script, flags in (("bench/bench_kernels.py", []), ("probes/greedy_actions.py", ["runs/x/last.pt"])):
        out = subprocess.run([sys.executable, str(ROOT / script), *flags, "--out", f"{blocker}/x"], capture_output=True,
                             text=True, timeout=300)  # fmt: skip
        assert out.returncode == 2 and "is not a folder this user can write in" in out.stderr, script
        assert "Traceback" not in out.stderr
