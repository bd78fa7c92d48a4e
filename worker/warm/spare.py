"""A spare host's standbys: `python -m worker warm.spare` with a JSON list of worker specs on
stdin, those of one host's tasks named for this host. For each, a keeper named by its slot
(registry.spare_task) imports TensorFlow in a standby under the environment that task's trainer
would have here, so that a task moved to this host starts warm (activation.warm_start takes any
standby whose fingerprint matches). The supervisor runs it again while the host stays a spare:
each run is a visit, and a keeper no agent or visit reaches for its linger ends with its
standby; the job's end releases them at once. Prints one JSON line: the slots asked for, and
the notes of those that got no standby."""

from __future__ import annotations

import json
import sys

from worker.agent import trainer_env
from worker.container import warm_env
from worker.spec import WorkerSpec
from worker.warm.preparation import prepare_standby
from worker.warm.registry import SPARE_SLOTS

MAX_INPUT = 4 << 20


def keep_standbys(specs: list[WorkerSpec]) -> dict[str, object]:
    notes: list[str] = []
    for slot, spec in enumerate(specs[:SPARE_SLOTS]):
        env = trainer_env(spec)
        env = warm_env(spec, env) if spec.container else env
        keeper = prepare_standby(spec, env, None, notes.append, lambda pid, rss: None, slot)
        if keeper is not None:
            keeper.close()
    return {"slots": min(len(specs), SPARE_SLOTS), "notes": notes}


def main() -> int:
    raw = json.loads(sys.stdin.buffer.read(MAX_INPUT))
    specs = [WorkerSpec.from_json(json.dumps(item)) for item in raw]
    print(json.dumps(keep_standbys(specs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
