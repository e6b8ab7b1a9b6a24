"""Where two cProfile runs of the same work differ: python scripts/profile_diff.py A.prof B.prof

Prints each run's host seconds and the functions whose own time (tottime) grew most from B to
A, with their call counts in A: what a switch (timing on against off) costs, and where.
"""

import pstats
import sys


def own_times(path: str) -> dict[str, tuple[float, int]]:
    out = {}
    for (file, line, name), (prim, _calls, tottime, _cum, _callers) in pstats.Stats(path).stats.items():
        short = file.split("/site-packages/")[-1].split("/ddp_lab/")[-1]
        out[f"{short}:{line}({name})"] = (tottime, prim)
    return out


def main(a_path: str, b_path: str, top: int = 14) -> None:
    a, b = own_times(a_path), own_times(b_path)
    print(f"host seconds: {sum(v[0] for v in a.values()):.2f} ({a_path}), "
          f"{sum(v[0] for v in b.values()):.2f} ({b_path})")
    grew = sorted(((a.get(k, (0.0, 0))[0] - b.get(k, (0.0, 0))[0], k) for k in set(a) | set(b)),
                  reverse=True)
    print("own time grown most (seconds A - B, calls in A):")
    for d, k in grew[:top]:
        print(f"  {d:+.3f} s {a.get(k, (0.0, 0))[1]:>8} calls  {k}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
