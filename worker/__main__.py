"""Run one of the worker's programs: `python -m worker NAME ARG...` where the package is
installed, or `python DIR/worker NAME ARG...` from a shipped copy (worker.ship), which needs
nothing installed. Either way it is `python -m worker.NAME ARG...`."""

from __future__ import annotations

import os
import runpy
import sys
import threading

PROGRAMS = ("agent", "hostd", "slurm_task", "probe", "proctl", "warm.spare")

if __name__ == "__main__":
    if not __package__:  # run as a directory: import the package from its parent
        sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        # A job's program keeps its copy from being pruned while it runs, on every host.
        from worker.ship import renew

        threading.Thread(target=renew, args=(sys.path[0],), name="renew", daemon=True).start()
    if sys.argv[1:2] == [] or sys.argv[1] not in PROGRAMS:
        sys.exit(f"usage: python -m worker ({' | '.join(PROGRAMS)}) ARG...")
    del sys.argv[0]
    runpy.run_module(f"worker.{sys.argv[0]}", run_name="__main__", alter_sys=True)
