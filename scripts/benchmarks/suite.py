"""The benchmark suite's rows (scripts/bench.py runs it): each figure next to a raw baseline
measured in the same run, every target fixed here before the run (see rows.py)."""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from scripts.benchmarks import measure
from scripts.benchmarks.container import container_rows
from scripts.benchmarks.container import row as container_row
from scripts.benchmarks.container import warm_row as warm_container_row
from scripts.benchmarks.hostloss import host_loss_rows
from scripts.benchmarks.hostloss import rows as host_loss_row_defs
from scripts.benchmarks.infra import (
    agent_rss,
    dry_run_1000,
    ssh_rows,
    status_with_store,
    trainer_rss,
)
from scripts.benchmarks.measure import (
    callback_ab,
    middle_rate,
    no_kept_standbys,
    orchestrate_run,
    plain_rates,
    raw_run,
)
from scripts.benchmarks.overhead import cpu_shares
from scripts.benchmarks.rows import Row
from scripts.benchmarks.slurm import rows as slurm_row_defs
from scripts.benchmarks.slurm import slurm_rows
from scripts.benchmarks.warm import relaunch_row, relaunch_rows, restart_rows
from scripts.benchmarks.warm import rows as warm_row_defs


def fast_epochs_note(pairs: list[tuple[float, float]]) -> str:
    """The pairs' fastest tenth of middle epochs (ours / the baseline's). On this machine whole
    runs of steps, ours and hand-started alike, are held to 108/n steps/s (n = 1, 2, 3: steps
    of 9.3 ms multiples); the fastest epochs show the pace outside them (docs/measurements.md)."""
    ratios = sorted(ours / theirs for ours, theirs in pairs)
    return (
        f"the fastest tenth of each run's middle epochs (the pace outside this machine's "
        f"108/n steps/s spells), ours / baseline: {statistics.median(ratios):.2f}x median "
        f"({ratios[0]:.2f}-{ratios[-1]:.2f}); " + ", ".join(f"{a:.0f}/{b:.0f}" for a, b in pairs)
    )


def run_suite(quick: bool) -> list[Row]:
    if quick:  # P3c's first window (3 s from epoch 3) ends before it
        measure.RESTART_EXTRA = "standby_delay = 8"
    repeat = 1 if quick else 3
    pairs = 1 if quick else 9  # P3's target is read from the median of at least 9 pairs
    plain_pairs = 1 if quick else 9  # P9's jobs are short and its rounds span about +-10 %
    epochs = 6 if quick else 12
    hosts = [1, 4] if quick else [1, 4, 16]
    rows = {
        "P1": Row(
            "P1",
            "launch fan-out to every agent running",
            "s",
            kind="ratio",
            target_ratio=1.3,
            baseline_label="threads + paramiko (NODELAY), 1 exec/host",
            target="16 hosts <= 1.3x raw; CPU <= 10 ms/host",
        ),
        "P2": Row(
            "P2",
            "launch to first training step, 2 workers",
            "s",
            kind="ratio",
            target_ratio=1.0,
            baseline_label="workers started by hand with TF_CONFIG",
            target="<= 1.0x raw",
        ),
        "P3": Row(
            "P3",
            "steady throughput (middle epochs)",
            "steps/s",
            kind="inverse",
            target_ratio=0.98,
            baseline_label="the same hand-started workers",
            target=">= 0.98x raw",
        ),
        "P3c": Row(
            "P3c",
            "CPU of ours beside the trainers, steady training, every default on",
            "cores",
            target_value=0.02,
            baseline_label="the trainers' own CPU",
            target="<= 0.02 cores (1 % of this 2-core host)",
        ),
        "P4": Row(
            "P4",
            "trainer SIGKILL -> supervisor begins stopping",
            "s",
            target_value=2.0,
            baseline_label="TensorFlow's own: survivor exits",
            target="<= 2 s",
        ),
        "P6": Row("P6", "status, 20 jobs x 16 tasks", "s", target_value=0.3, target="<= 0.3 s"),
        "P7a": Row(
            "P7a",
            "peak RSS of one agent",
            "MB",
            target_value=40,
            baseline_label="the trainer's own peak RSS",
            target="<= 40 MB",
        ),
        "P7b": Row(
            "P7b",
            "peak RSS of the supervisor, 16 SSH hosts",
            "MB",
            target_value=100,
            baseline_label="the trainer's own peak RSS",
            target="<= 100 MB",
        ),
        "P8": Row("P8", "plan + --dry-run, 1,000 hosts", "s", target_value=1.0, target="<= 1 s"),
        "P9": Row(
            "P9",
            "plain fit script through the bootstrap, steady throughput",
            "steps/s",
            kind="inverse",
            target_ratio=0.98,
            baseline_label="the same script, instrument = false",
            target=">= 0.98x (cost <= 2 %)",
            paired=True,
        ),
        "P9b": Row(
            "P9b",
            "the bootstrap's fit callbacks, one process, fit calls alternating",
            "steps/s",
            kind="inverse",
            target_ratio=0.98,
            baseline_label="fit without them",
            target=">= 0.98x (cost <= 2 %)",
        ),
    }
    rows["P10"], rows["P11"] = host_loss_row_defs()
    rows["P12"], rows["P13"] = slurm_row_defs()
    rows["P5"], rows["P14"], rows["P14b"] = warm_row_defs()
    rows["P15"] = relaunch_row()
    rows["P2c"], rows["P14c"] = container_row(), warm_container_row()
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        root = Path(tmp)
        (root / "shared").mkdir()
        home = root / "home"
        print("P8 dry run of 1,000 hosts ...", flush=True)
        rows["P8"].values = dry_run_1000(root, 2 if quick else 5)
        print("P6 status with 20 x 16 tasks ...", flush=True)
        rows["P6"].values = status_with_store(root, 3 if quick else 10)
        print("P7 agent RSS ...", flush=True)
        rows["P7a"].values = [agent_rss(root) for _ in range(repeat)]
        print("P2/P3 cold start and throughput, raw and orchestrated, alternating ...", flush=True)
        rows["P2"].paired = rows["P3"].paired = True
        parts = []
        fast: dict[str, list[tuple[float, float]]] = {"P3": [], "P9": []}  # (ours, theirs)
        for i in range(pairs):  # each pair's order alternates: no side gains by going first
            if i % 2:
                ours = orchestrate_run(root, home, epochs)
                no_kept_standbys()  # the hand-started workers share the machine with nothing
                raw = raw_run(root, epochs)
            else:
                raw = raw_run(root, epochs)
                ours = orchestrate_run(root, home, epochs)
            rows["P2"].baseline.append(raw["first_step"])
            rows["P2"].values.append(ours["first_step"])
            parts.append(ours)
            rows["P3"].baseline.append(raw["throughput"])
            rows["P3"].values.append(ours["throughput"])
            fast["P3"].append((ours["fast"], raw["fast"]))
        rows["P2"].note = (
            "where a first launch's time goes (medians from the launch): "
            + ", ".join(
                f"{label} {statistics.median(p[key] for p in parts):.2f} s"
                for key, label in (
                    ("created", "job registered (CLI start, validation)"),
                    ("launched", "agents started (preflight, plan)"),
                    ("first_step", "first step (the trainers' interpreter, TensorFlow, MWMS)"),
                )
            )
        )
        print("P3c CPU of our processes beside the trainers ...", flush=True)
        windows = []
        for _ in range(repeat):
            shares = cpu_shares(root, home, 1000, 3.0 if quick else 8.0)  # stopped once measured
            ready = shares["standbys_ready"]
            ours = [v for k, v in ready.items() if k not in ("trainer", "steps_per_s")]
            rows["P3c"].values.append(sum(ours))
            rows["P3c"].baseline.append(ready.get("trainer", 0.0))
            windows.append(shares)
        rows["P3c"].note = (
            "once both standbys are ready (agents, keepers, supervisor). The trainers' steps/s "
            "before the standbys / while they import TensorFlow (after standby_delay, at idle "
            "priority; standbys' cores) / once ready: "
            + ", ".join(
                f"{w['training']['steps_per_s']:.0f} / "
                + (
                    f"{w['standbys_importing']['steps_per_s']:.0f}"
                    f" ({w['standbys_importing'].get('standby', 0.0):.2f} cores)"
                    if w["standbys_importing"]
                    else "(imported within the first window)"
                )
                + f" / {w['standbys_ready']['steps_per_s']:.0f}"
                for w in windows
            )
        )
        print("P9 plain fit script with and without the bootstrap, alternating ...", flush=True)
        for i in range(plain_pairs):
            pair = {}
            for instrument in (True, False) if i % 2 else (False, True):
                rates = plain_rates(root, home, epochs, instrument=instrument)
                rate = middle_rate(rates, epochs)
                (rows["P9"].values if instrument else rows["P9"].baseline).append(rate)
                pair[instrument] = middle_rate(rates, epochs, fast=True)
            fast["P9"].append((pair[True], pair[False]))
        for key in ("P3", "P9"):
            rows[key].note = fast_epochs_note(fast[key])
        ab = callback_ab(root, 3 if quick else 15)
        rows["P9b"].baseline = [without for without, _ in ab]
        rows["P9b"].values = [with_ours for _, with_ours in ab]
        rows["P9b"].note = (
            f"{len(ab)} rounds of alternating fit calls of the digits MLP in one process "
            "(one-worker MWMS: the smallest step, where a per-step cost shows most); without / "
            "with: " + ", ".join(f"{a:.0f}/{b:.0f}" for a, b in ab)
        )
        trainer = trainer_rss(root, home)
        for key in ("P7a", "P7b"):
            rows[key].baseline = [trainer]
        print("P1/P7 SSH test bed ...", flush=True)
        ssh_rows(root, hosts, repeat if quick else 5, rows["P1"], rows["P7b"])
        print("P10/P11 losing a host on the SSH test bed ...", flush=True)
        host_loss_rows(root, 1 if quick else 2, rows["P10"], rows["P11"], quick)
        print("P12/P13 the Slurm test bed ...", flush=True)
        slurm_rows(root, 1 if quick else 3, rows["P12"], rows["P13"])
        print("P5/P14 restarts, cold and warm, each beside a cold start by hand ...", flush=True)
        cold_restarts = restart_rows(root, home, repeat, rows["P5"], rows["P14"], rows["P14b"])
        rows["P4"].values = [run["seen"] for run in cold_restarts]
        print("P2c/P14c launches and warm restarts in a podman image, beside it by hand ...",
              flush=True)  # fmt: skip
        container_rows(root, home, 1 if quick else 3, rows["P2c"], rows["P14c"])
        print("P15 relaunches in kept standbys, each beside a cold start by hand ...", flush=True)
        relaunch_rows(root, home, repeat, rows["P15"])
        print("P4's baseline: TensorFlow's own reaction to a killed worker ...", flush=True)
        for _ in range(repeat):
            survivor = raw_run(root, 30, kill_at_epoch=3).get("survivor_exit")
            if survivor is None:
                rows["P4"].failed_rounds += 1  # TensorFlow's survivor hung past the cap
            else:
                rows["P4"].baseline.append(survivor)
    return list(rows.values())
