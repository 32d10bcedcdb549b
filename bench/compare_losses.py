"""Are two runs' losses bit-identical up to a step? (a refactor must not change training)

    python bench/compare_losses.py RUN_A RUN_B --until 200000

Reads every `losses/*` scalar of both TensorBoard logs at steps <= --until and compares them exactly (float32 as
logged). Exits 1 and names the first difference if any value, tag or step differs.
"""

import argparse
import os
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def losses(run_dir, until):
    if not os.path.isdir(run_dir):
        sys.exit(f"{run_dir} is not a run directory")
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = [t for t in acc.Tags()["scalars"] if t.startswith("losses/")]
    return {t: [(e.step, e.value) for e in acc.Scalars(t) if e.step <= until] for t in tags}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--until", type=int, default=200_000)
    a = p.parse_args()
    la, lb = losses(a.run_a, a.until), losses(a.run_b, a.until)
    if set(la) != set(lb):
        sys.exit(f"different loss tags: {sorted(set(la) ^ set(lb))}")
    if not la:
        sys.exit(f"no losses/* scalars in {a.run_a}")
    for tag in sorted(la):
        if len(la[tag]) != len(lb[tag]) or not la[tag]:
            sys.exit(f"{tag}: {len(la[tag])} vs {len(lb[tag])} points up to step {a.until}")
        for (sa, va), (sb, vb) in zip(la[tag], lb[tag], strict=True):
            if sa != sb or va != vb:
                sys.exit(f"{tag} differs at step {sa}/{sb}: {va!r} vs {vb!r}")
    n = sum(len(v) for v in la.values())
    last = max(s for v in la.values() for s, _ in v)
    print(f"identical: {len(la)} loss tags, {n} values, steps up to {last} (<= {a.until})")


if __name__ == "__main__":
    main()
