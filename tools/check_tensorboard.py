#!/usr/bin/env python3
"""Reads the TensorBoard event files of app run directories with TensorBoard's own reader and
prints each scalar's last values: the check that `tensorboard --logdir` shows the curves.

    python3 tools/check_tensorboard.py runs/vit runs/textclf runs/gpt     # needs `pip install tensorboard`

Exit status 1 when a directory has no scalars. (The test suite checks the same files byte by byte
with its own reader, tests/apps/test_common.cpp, without TensorBoard.)
"""
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main(dirs):
    ok = True
    for d in dirs:
        ea = EventAccumulator(d)
        ea.Reload()
        tags = ea.Tags()["scalars"]
        print(f"{d}: {len(tags)} scalars")
        ok &= bool(tags)
        for t in tags:
            ev = ea.Scalars(t)
            print(f"  {t:20s} {len(ev):4d} points, last: step {ev[-1].step} value {ev[-1].value:.6g}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
