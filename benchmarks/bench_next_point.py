"""How often the recipe's next measurement is the one that narrows its least certain band most.

    python benchmarks/bench_next_point.py [--seeds 5] [--draws 60]

For every synthetic truth (tests/helpers/synthetic_dp.py: TRUTHS, and MISMATCHED with effects the step model lacks)
measured at dp {1, 8} under a profile of its network, asked for 16, 32 and 64 GPUs: the count the recipe suggests
(scaling.recipe.next_point: a simulated measurement at its own nominal figure) against measuring each option below
the least certain row for real (a noisy point of the truth, the band refitted). A suggestion is right when its real
half-width is within 5% of the narrowest option's (the draws' own noise). Prints Markdown; asserts nothing. The
published tables are not used: none has two counts between its smallest and its horizon to choose from.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers.next_point import next_point_outcomes
from tests.helpers.synthetic_dp import MISMATCHED, TRUTHS


def main() -> None:
    """Print the table and the share of right suggestions."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--draws", type=int, default=60)
    a = p.parse_args()
    print("| truth | seed | suggested | real half-width per option | right |")
    print("|---|---|---|---|---|")
    right = total = 0
    regrets = []
    for t in (*TRUTHS, *MISMATCHED):
        for seed in range(a.seeds):
            suggested, outcomes = next_point_outcomes(t, [16, 32, 64], [1, 8], seed, a.draws)
            if suggested is None or len(outcomes) < 2:
                continue
            best = min(outcomes.values())
            ok = outcomes[suggested] <= best * 1.05
            right, total = right + ok, total + 1
            regrets.append(outcomes[suggested] / best - 1)
            cells = ", ".join(f"{n}: ±{h:.1%}" for n, h in sorted(outcomes.items()))
            print(f"| {t.name} | {seed} | {suggested} | {cells} | {'yes' if ok else 'no'} |")
    print()
    print(
        f"Right in {right} of {total} cases ({right / max(total, 1):.0%}); the median excess half-width of the "
        f"suggestion over the narrowest option {statistics.median(regrets):.1%}, the largest {max(regrets):.1%}."
    )


if __name__ == "__main__":
    main()
