"""What a job holds while it runs (the queue's claims), pure."""

from __future__ import annotations

import tomllib
from pathlib import Path

from orchestrator.config import ClusterConfig, parse_config
from orchestrator.planning.claims import EVERY_GPU, claims, first_overlap


def test_what_a_job_holds_gpus_slots_and_hosts_by_address(tmp_path: Path) -> None:
    """The claims, pure: GPUs on a GPU host (every one on a "per_gpu" host), task slots
    elsewhere; hosts told apart by address; spares claim nothing until they serve."""

    def config(backend: str) -> ClusterConfig:
        return parse_config(
            tomllib.loads(
                f'[job]\nname = "j"\nshared_dir = "{tmp_path}"\n[entrypoint]\nscript = "t.py"\n'
                f"[backend]\n{backend}\n"
            )
        )

    two = claims(config('type = "local"\nworkers = 2'))
    one = claims(config('type = "local"\nworkers = 1'))
    assert [(c.gpu, c.slot) for c in two] == [(None, 0), (None, 1)]
    assert first_overlap(one, two) == one[0]
    gpus = claims(config('type = "local"\nworkers = 2\ngpus_per_task = 2'))
    every = claims(config('type = "local"\nworkers = "per_gpu"\ngpus_per_task = 1'))
    assert [c.gpu for c in gpus] == [0, 1, 2, 3] and [c.gpu for c in every] == [EVERY_GPU]
    assert first_overlap(every, gpus) is not None
    assert first_overlap(gpus, two) is None  # GPUs and CPU slots are not the same thing
    assert gpus[3].describe() == "GPU 3 on local" and two[1].describe() == "task slot 1 on local"
    ssh = claims(
        config(
            'type = "ssh"\n[[backend.hosts]]\naddress = "10.0.0.1"\n'
            '[[backend.hosts]]\naddress = "10.0.0.2"\n[[backend.hosts]]\n'
            'address = "10.0.0.3"\nspare = true'
        )
    )
    assert [(c.address, c.slot) for c in ssh] == [("10.0.0.1", 0), ("10.0.0.2", 0)]
    assert first_overlap(ssh[1:], two) is None
