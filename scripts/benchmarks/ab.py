"""In-process A/B runs on the plain training script (tests/fixtures/plain_fit.py, loaded as its
own __main__ with no epochs): alternate `fit` calls without and with what orchestrate adds, in
one process, and print each pair's steps per second as a BENCH line.

    python scripts/benchmarks/ab.py --backup-dir DIR --callbacks ROUNDS  # P9b: the bootstrap's
    python scripts/benchmarks/ab.py --backup-dir DIR --waits ROUNDS      # the wait clock's

Started by path (measure.BENCH_AB): it imports only `worker` and TensorFlow, nothing of scripts.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PLAIN_FIT = REPO / "tests" / "fixtures" / "plain_fit.py"


def load_plain_fit(backup_dir: str) -> dict[str, Any]:
    """The script's globals after it built its model and dataset (and trained no epoch). Its
    BackupAndRestore gets a directory of its own: it deletes it when fit ends."""
    argv = sys.argv
    own = tempfile.mkdtemp(prefix="plain-fit-backup-", dir=backup_dir)
    sys.argv = [str(PLAIN_FIT), "--bench", "--epochs", "0", "--backup-dir", own]
    try:
        return runpy.run_path(str(PLAIN_FIT), run_name="__main__")
    finally:
        sys.argv = argv


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backup-dir", required=True)
    parser.add_argument("--callbacks", type=int, default=0, metavar="ROUNDS")
    parser.add_argument("--waits", type=int, default=0, metavar="ROUNDS")
    args = parser.parse_args()
    script = load_plain_fit(args.backup_dir)
    tf, model, dataset, steps = script["tf"], script["model"], script["dataset"], script["steps"]
    long = 10 * steps  # one fit call's own set-up is then a small share
    if args.waits:
        from tensorflow.python.distribute import cross_device_utils, input_lib

        from worker import wait_clock

        launcher = cross_device_utils.CollectiveReplicaLauncher
        iterator = input_lib.DistributedIteratorBase
        plain = (launcher.all_reduce, launcher._all_gather, iterator.get_next)
        clock = wait_clock.install(tf)
        timed = (launcher.all_reduce, launcher._all_gather, iterator.get_next)

        def fit_with(methods: tuple[Any, ...], steps_: int) -> float:
            launcher.all_reduce, launcher._all_gather, iterator.get_next = methods
            model.train_function = None  # traced again, with or without the timestamps
            started = time.perf_counter()
            model.fit(dataset, epochs=1, steps_per_epoch=steps_, verbose=0)
            return steps_ / (time.perf_counter() - started)

        fit_with(plain, steps)
        fit_with(timed, steps)  # warm up both
        for _ in range(args.waits):
            print(f"BENCH ab {fit_with(plain, long):.3f} {fit_with(timed, long):.3f}", flush=True)
        print(f"BENCH clock {json.dumps(clock.seconds())}", flush=True)
    if args.callbacks:
        from worker.callbacks import preemption_callback_class, progress_callback_class
        from worker.progress import ProgressWriter

        base = tf.keras.callbacks.Callback
        writer = ProgressWriter(Path(args.backup_dir) / "progress.json")
        strategy = script["strategy"]
        ours = [
            progress_callback_class(base)(writer),
            preemption_callback_class(base, tf)(strategy),
        ]
        model.fit(dataset, epochs=1, steps_per_epoch=steps, callbacks=ours, verbose=0)  # warm up
        for _ in range(args.callbacks):
            rates = []
            for callbacks in ([], ours):
                started = time.perf_counter()
                model.fit(dataset, epochs=1, steps_per_epoch=long, callbacks=callbacks, verbose=0)
                rates.append(long / (time.perf_counter() - started))
            print(f"BENCH ab {rates[0]:.3f} {rates[1]:.3f}", flush=True)


if __name__ == "__main__":
    main()
