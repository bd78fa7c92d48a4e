"""What the host helper tells of checkpoint files without TensorFlow: prefixes found under a
root (not in hidden directories), their size, number and the `checkpoint` file's latest, and
a checkpoint missing a data shard refused before TensorFlow is asked."""

from __future__ import annotations

from pathlib import Path

from worker import checkpoints


def test_prefixes_are_found_described_and_a_missing_shard_is_named(tmp_path: Path) -> None:
    run = tmp_path / "run" / "ckpt"
    run.mkdir(parents=True)
    (run / "ckpt-3.index").write_bytes(b"i" * 10)
    (run / "ckpt-3.data-00000-of-00002").write_bytes(b"d" * 100)
    (run / "ckpt-3.data-00001-of-00002").write_bytes(b"d" * 50)
    (run / "ckpt-4.index").write_bytes(b"i" * 10)
    (run / "ckpt-4.data-00000-of-00002").write_bytes(b"d" * 100)  # its second shard is gone
    (run / "checkpoint").write_text('model_checkpoint_path: "ckpt-4"\n')
    hidden = tmp_path / "run" / ".venv" / "lib"
    hidden.mkdir(parents=True)
    (hidden / "other-1.index").write_bytes(b"x")

    found = {Path(c["prefix"]).name: c for c in checkpoints.find([str(tmp_path / "run")])}
    assert set(found) == {"ckpt-3", "ckpt-4"}
    assert (found["ckpt-3"]["bytes"], found["ckpt-3"]["number"]) == (160, 3)
    assert (found["ckpt-3"]["shards"], found["ckpt-3"]["shards_expected"]) == (2, 2)
    assert found["ckpt-4"]["latest"] and not found["ckpt-3"]["latest"]

    verdicts = checkpoints.verify([found["ckpt-4"]])  # TensorFlow is not asked for it
    assert verdicts[str(run / "ckpt-4")]["ok"] is False
    assert verdicts[str(run / "ckpt-4")]["problem"] == "incomplete: 1 of 2 data shard(s)"


def test_the_other_jobs_directories_beside_a_job_s_own_are_not_its(tmp_path: Path) -> None:
    """A working directory that holds the shared directory: another job's backup there is
    not this job's; a user's own directory beside the jobs' is."""
    shared = tmp_path / "shared"
    for name in ("job-a/checkpoints/backup/chief", "job-b/checkpoints/backup/chief", "mine"):
        (shared / name).mkdir(parents=True)
        (shared / name / "ckpt-1.index").write_bytes(b"i")
        (shared / name / "ckpt-1.data-00000-of-00001").write_bytes(b"d")
    for job in ("job-a", "job-b"):
        (shared / job / "tasks").mkdir()
    found = checkpoints.find([str(tmp_path)], own=str(shared / "job-a"))
    assert sorted(str(Path(c["prefix"]).relative_to(shared)) for c in found) == [
        "job-a/checkpoints/backup/chief/ckpt-1",
        "mine/ckpt-1",
    ]
