"""The chaos soak's figures: reads the JSON files `python -m scripts.chaos --json` wrote and
writes docs/chaos/results.md (per backend and fault kind: count, detection and recovery time
median and worst, the restart budget used, violations) and docs/chaos/results.png. From the
repository root:

    python -m scripts.chaos_report /tmp/soak/local.json /tmp/soak/ssh.json /tmp/soak/slurm.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scripts.soak.report import OUT, chart, markdown, rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.chaos_report", description=__doc__)
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()
    runs = [json.loads(p.read_text()) for p in args.runs]
    table = rows(runs)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.md").write_text(markdown(runs, table))
    (OUT / "results.json").write_text(json.dumps(runs, indent=1))
    chart(table, OUT / "results.png")
    print(f"{sum(r['count'] for r in table)} faults, "
          f"{sum(len(r['violations']) for r in runs)} violations -> {OUT}")  # fmt: skip


if __name__ == "__main__":
    main()
