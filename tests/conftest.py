"""Checks shared by the script tests."""

import pytest
import torch


@pytest.fixture
def resume_keeps_best():
    """check(run_dir, train, resume, scalars): after `train()` (two evaluations) every checkpoint holds the best
    evaluation so far; after `resume()` (two more, from a last.pt whose best no evaluation reaches) best.pt is
    untouched."""

    def check(run_dir, train, resume, scalars):
        train()
        best = max(v for _, v in scalars(run_dir, "eval/episodic_return"))
        last = torch.load(run_dir / "last.pt", weights_only=True)
        assert last["best_eval"] == pytest.approx(best, rel=1e-5)
        assert torch.load(run_dir / "best.pt", weights_only=True)["best_eval"] == pytest.approx(best, rel=1e-5)
        last["best_eval"] = float("inf")  # a best before the interruption that no later evaluation reaches
        torch.save(last, run_dir / "last.pt")
        before = (run_dir / "best.pt").read_bytes()
        resume()
        assert len(scalars(run_dir, "eval/episodic_return")) == 4  # two evaluations after the resume...
        assert (run_dir / "best.pt").read_bytes() == before  # ...and neither replaced best.pt
        assert torch.load(run_dir / "last.pt", weights_only=True)["best_eval"] == float("inf")

    return check
