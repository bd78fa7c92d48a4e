"""The chaos soak's figures: reads the JSON files `python -m scripts.chaos --json` wrote and
writes docs/chaos/results.md (per backend and fault kind: count, detection and recovery time
median and worst, the restart budget used, violations) and docs/chaos/results.png. From the
repository root:

    python -m scripts.chaos_report /tmp/soak/local.json /tmp/soak/ssh.json /tmp/soak/slurm.json

`--before FILE` (an earlier results.json, kept beside) adds those runs' recovery medians beside
the new ones.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scripts.soak.report import OUT, beside, chart, markdown, rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.chaos_report", description=__doc__)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--before", type=Path, help="an earlier results.json, shown beside")
    args = parser.parse_args()
    runs = [json.loads(p.read_text()) for p in args.runs]
    table = rows(runs)
    text = markdown(runs, table)
    if args.before:
        where = args.before.resolve().relative_to(OUT.resolve()).parent / "results.md"
        text += "\n" + beside(json.loads(args.before.read_text()), table, str(where))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.md").write_text(text)
    (OUT / "results.json").write_text(json.dumps(runs, indent=1))
    chart(table, OUT / "results.png")
    print(f"{sum(r['count'] for r in table)} faults, "
          f"{sum(len(r['violations']) for r in runs)} violations -> {OUT}")  # fmt: skip


if __name__ == "__main__":
    main()
