#!/usr/bin/env python3
"""What a majority vote of several textclf runs would score, from their test_errors.tsv files.

    tools/seed_vote.py N_TEST RUN_DIR_OR_TSV...

A two-class set only: a test text is wrong in the vote when more than half of the runs got it
wrong (test_errors.tsv lists the texts a run's model got wrong, by their index in the test split,
with the run's prediction in its "model" column; rows where only the baseline was wrong are
skipped). Prints each run's accuracy, then for every odd group size k the mean, lowest and highest
vote accuracy over all groups of k runs.
"""
import csv
import itertools
import os
import sys


def wrong_indices(path):
    if os.path.isdir(path):
        path = os.path.join(path, "test_errors.tsv")
    with open(path, newline="") as f:
        return {int(r["index"]) for r in csv.DictReader(f, delimiter="\t") if r["model"] != r["true"]}


def usage(message):
    print(f"seed_vote.py: {message}\n{__doc__}", file=sys.stderr)
    sys.exit(2)


def main():
    if len(sys.argv) < 3:
        usage("give the number of test texts and at least one run")
    try:
        n = int(sys.argv[1])
    except ValueError:
        usage(f"N_TEST must be a positive integer, got {sys.argv[1]!r}")
    if n <= 0:
        usage(f"N_TEST must be a positive integer, got {n}")
    try:
        runs = [wrong_indices(p) for p in sys.argv[2:]]
    except (OSError, KeyError, ValueError) as e:
        usage(f"cannot read a run's test_errors.tsv: {e}")
    for p, w in zip(sys.argv[2:], runs):
        print(f"{p}: {100 * (n - len(w)) / n:.2f}%")
    for k in range(1, len(runs) + 1, 2):
        accs = []
        for group in itertools.combinations(runs, k):
            votes = {}
            for w in group:
                for i in w:
                    votes[i] = votes.get(i, 0) + 1
            accs.append(100 * (n - sum(v > k / 2 for v in votes.values())) / n)
        print(f"vote of {k}: mean {sum(accs) / len(accs):.2f}%, lowest {min(accs):.2f}%, highest {max(accs):.2f}%"
              f" ({len(accs)} groups)")


if __name__ == "__main__":
    main()
