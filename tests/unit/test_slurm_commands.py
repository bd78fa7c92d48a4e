"""The Slurm backend's pure parts: its config section, the sbatch and srun command lines, what
squeue and sbatch print, and the plan of a step from its tasks' hellos. The real thing runs in
tests/test_slurm.py."""

from __future__ import annotations

import shlex
from pathlib import Path
from threading import Event

import pytest

from orchestrator.backends.preflight import step_problems
from orchestrator.backends.slurm import Hello, SlurmHosts
from orchestrator.backends.slurm_allocation import AllocationEnded
from orchestrator.backends.slurm_commands import (
    AllocationView,
    SlurmState,
    dry_run_lines,
    keeper_srun_argv,
    literal_for_pattern,
    refusal_key,
    refusal_reason,
    sbatch_argv,
    slurm_seconds,
    srun_argv,
)
from orchestrator.config import ClusterConfig, SlurmBackend, load_config
from orchestrator.errors import ConfigError
from orchestrator.planning.plan import StepTask, initial_hosts, step_plan, task_slots
from worker.spec import HOST_PROTOCOL, JobLayout


def slurm_config(tmp_path: Path, backend: str = "", extra: str = "") -> ClusterConfig:
    text = f"""
[job]
name = "sl"
shared_dir = "{tmp_path}/shared dir"

[entrypoint]
module = "worker.examples.digits"

[backend]
type = "slurm"
nodes = 2
{backend}
{extra}
"""
    path = tmp_path / "c.toml"
    path.write_text(text)
    return load_config(path)


def test_a_slurm_section_is_read_with_defaults(tmp_path: Path) -> None:
    cfg = slurm_config(tmp_path, 'partition = "gpu"\ntasks_per_node = 4\ngres = "gpu:4"')
    backend = cfg.backend
    assert isinstance(backend, SlurmBackend)
    assert (backend.partition, backend.nodes, backend.tasks_per_node) == ("gpu", 2, 4)
    assert backend.requeue and backend.signal_before_end == 120 and backend.python == "python3"
    assert initial_hosts(cfg) == (0, 1)
    slots = task_slots(cfg)
    assert [(s.host_index, s.slot) for s in slots] == [(n, s) for n in (0, 1) for s in range(4)]


@pytest.mark.parametrize(
    "arg", ["--constraint=ib", "-C", "--mem=0", "-wnode1", "-vC", "--time-min=5"]
)
def test_sbatch_options_that_are_not_ours_pass(tmp_path: Path, arg: str) -> None:
    cfg = slurm_config(tmp_path, f'sbatch_args = ["{arg}"]')
    assert arg in sbatch_argv(cfg, "j", "/o", "/r")


def test_a_percent_in_the_shared_dir_is_literal_in_slurms_output_patterns() -> None:
    assert literal_for_pattern("/shared/100%/x") == "/shared/100%%/x"


@pytest.mark.parametrize(
    ("backend", "extra", "message"),
    [
        ('time = "ten minutes"', "", "backend.time"),
        ('partition = "a b"', "", "backend.partition"),
        ('gres = "gpu:"', "", "backend.gres"),
        ("nodes_typo = 3", "", "backend.nodes_typo"),
        ('sbatch_args = ["--nodes=4"]', "", "sbatch_args[0]: '--nodes=4' is sbatch's --nodes: use"),
        (
            'sbatch_args = ["-p", "x"]',
            "",
            "backend.sbatch_args[0]: '-p' is sbatch's -p: use backend",
        ),
        ('sbatch_args = ["--wrap=x"]', "", "is sbatch's --wrap: orchestrate sets it"),
        # sbatch reads a long option by any unique prefix, and short ones clustered or with
        # their value attached: each of these is one of ours.
        ('sbatch_args = ["--wra=x"]', "", "'--wra=x' is sbatch's --wrap: orchestrate sets it"),
        ('sbatch_args = ["--outp=/x"]', "", "'--outp=/x' is sbatch's --output"),
        ('sbatch_args = ["--chd=/"]', "", "'--chd=/' is sbatch's --chdir"),
        ('sbatch_args = ["-o/path"]', "", "'-o/path' is sbatch's -o"),
        ('sbatch_args = ["-Jname"]', "", "'-Jname' is sbatch's -J"),
        ('sbatch_args = ["-vJname"]', "", "'-vJname' is sbatch's -J"),
        ('sbatch_args = ["--nod=2"]', "", "'--nod=2' is sbatch's --nodes: use backend.nodes"),
        ('sbatch_args = ["constraint=ib"]', "", "backend.sbatch_args[0]: 'constraint=ib' is not"),
        ("signal_before_end = 5", "", "backend.signal_before_end"),
        ("", "[ports]\nbase = 7000", "ports.base: the Slurm backend has each task pick"),
        ("", "[restart]\nmin_workers = 1", "restart.min_workers: not on the Slurm backend"),
    ],
)
def test_a_bad_slurm_section_is_one_line_naming_the_key(
    tmp_path: Path, backend: str, extra: str, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        slurm_config(tmp_path, backend, extra)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("spelling", ["30", "30:00", "1:00:00", "2-0", "2-12:30", "1-0:0:5"])
def test_slurm_time_spellings_are_accepted(tmp_path: Path, spelling: str) -> None:
    cfg = slurm_config(tmp_path, f'time = "{spelling}"')
    assert f"--time={spelling}" in sbatch_argv(cfg, "j", "/o", "/r")


def test_the_sbatch_line_holds_the_allocation_and_asks_for_the_end_signal(tmp_path: Path) -> None:
    cfg = slurm_config(
        tmp_path,
        'partition = "p"\naccount = "a"\nqos = "q"\ngres = "gpu:2"\nexclusive = true\n'
        'time = "1:00:00"\nsbatch_args = ["--constraint=ib"]\nsignal_before_end = 90',
    )
    argv = sbatch_argv(cfg, "job-1", "/s/out-%j", "/s/it's released")
    assert argv[:2] == ["sbatch", "--parsable"]
    for flag in ("--nodes=2", "--ntasks-per-node=1", "--signal=TERM@90", "--requeue",
                 "--partition=p", "--account=a", "--qos=q", "--gres=gpu:2", "--exclusive",
                 "--time=1:00:00", "--constraint=ib", "--job-name=sl", "--output=/s/out-%j",
                 f"--chdir={tmp_path}/shared dir"):  # fmt: skip
        assert flag in argv, flag
    # The batch script is a shell line: the release file's path is quoted once, there.
    script = argv[argv.index("--wrap") + 1]
    assert shlex.split(script)[-1] == "/s/it's released"
    assert "--test-only" in sbatch_argv(cfg, "job-1", "/o", "/r", test_only=True)
    plain = slurm_config(tmp_path, "requeue = false")
    assert "--no-requeue" in sbatch_argv(plain, "j", "/o", "/r")
    assert not any(a.startswith("--partition") for a in sbatch_argv(plain, "j", "/o", "/r"))


def test_the_srun_line_starts_one_task_per_worker_in_the_allocation(tmp_path: Path) -> None:
    cfg = slurm_config(tmp_path, "tasks_per_node = 2")
    program = ["/venv/python", "/s/.orchestrate/worker-0123/worker", "slurm_task"]
    argv = srun_argv(cfg, "17", 3, "/s/attempt-3", "/s/tasks/%t/agent.log", program)
    assert argv[0] == "srun"
    for flag in ("--jobid=17", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2",
                 "--distribution=block", "--kill-on-bad-exit=1",
                 "--output=/s/tasks/%t/agent.log"):  # fmt: skip
        assert flag in argv, flag
    assert argv[-5:] == [*program, "/s/attempt-3", "3"]


def test_the_keeper_step_puts_a_keeper_beside_each_task_and_never_ends_the_others(
    tmp_path: Path,
) -> None:
    cfg = slurm_config(tmp_path, "tasks_per_node = 2")
    program = ["/venv/python", "/s/.orchestrate/worker-0123/worker", "slurm_task"]
    argv = keeper_srun_argv(cfg, "17", "/s/tasks/%t/standby.log", program, "/s/job")
    # The attempts' placement (block, per node), so keeper N is on task N's node.
    for flag in ("--jobid=17", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2",
                 "--distribution=block", "--overlap", "--output=/s/tasks/%t/standby.log"):  # fmt: skip
        assert flag in argv, flag
    assert "--kill-on-bad-exit=1" not in argv  # a keeper that ends leaves the others be
    assert argv[-5:] == [*program, "--keeper", "/s/job"]
    lines = dry_run_lines(cfg)
    assert any(line.startswith("warm standbys, while the allocation runs: srun ") for line in lines)
    no_warm = slurm_config(tmp_path, "tasks_per_node = 2", "[restart]\nwarm_restart = false")
    assert not any("warm standbys" in line for line in dry_run_lines(no_warm))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0:34", 34), ("12:05", 725), ("1:00:00", 3600), ("2-03:04:05", 183845), ("1-0", 86400),
     ("UNLIMITED", None), ("NOT_SET", None), ("", None), ("INVALID", None)],
)  # fmt: skip
def test_slurm_durations(text: str, seconds: float | None) -> None:
    assert slurm_seconds(text) == seconds


def test_squeue_lines_and_states() -> None:
    view = AllocationView.parse("PENDING|Priority|(null)|UNLIMITED\n")
    assert view.state == SlurmState.PENDING and view.state.is_waiting()
    assert view.describe() == "PENDING (Priority)" and view.time_left is None
    running = AllocationView.parse("RUNNING|None|n[0-2]|4:10")
    assert running.describe() == "RUNNING" and running.time_left == 250
    assert SlurmState.parse("CANCELLED by 0").is_terminal()
    assert SlurmState.parse("") == SlurmState.GONE and SlurmState.GONE.is_terminal()
    assert SlurmState.parse("SOMETHING_NEW") == SlurmState.OTHER  # waited on, not an end
    assert SlurmState.OTHER.is_waiting() and not SlurmState.OTHER.is_terminal()
    assert not SlurmState.RUNNING.is_terminal() and not SlurmState.RUNNING.is_waiting()


def test_sbatch_refusals_name_their_key() -> None:
    stderr = (
        "sbatch: error: invalid partition specified: nope\n"
        "sbatch: error: Batch job submission failed: Invalid partition name specified\n"
    )
    reason = refusal_reason(stderr)
    assert reason == "Invalid partition name specified"
    assert refusal_key(reason) == "backend.partition"
    assert refusal_key("Invalid account or account/partition combination") == "backend.account"
    assert refusal_key("Requested node configuration is not available") == "backend.nodes"
    assert refusal_key("Requested time limit is invalid (missing or exceeds some limit)") == (
        "backend.time"
    )
    assert refusal_key("something else entirely") == "backend"


def hello(procid: int, node: str, port: int, **overrides: object) -> Hello:
    values: dict[str, object] = dict(
        procid=procid, node=node, address=node, port=port, pid=100 + procid, step="0",
        python="3.11.2", tensorflow="2.21.0", protocol=HOST_PROTOCOL, problems=(),
    )  # fmt: skip
    values.update(overrides)
    return Hello(**values)  # type: ignore[arg-type]


def test_a_step_plan_follows_the_tasks_in_procid_order() -> None:
    tasks = [StepTask("n3", "n3", 4000), StepTask("n3", "n3", 4001), StepTask("n1", "10.0.0.1", 5)]
    plan = step_plan("j", tasks)
    assert [(t.index, t.host_index, t.host_label) for t in plan.tasks] == [
        (0, 0, "n3"),
        (1, 0, "n3"),
        (2, 1, "n1"),
    ]
    assert plan.tf_config(2) == {
        "cluster": {"worker": ["n3:4000", "n3:4001", "10.0.0.1:5"]},
        "task": {"type": "worker", "index": 2},
    }
    with pytest.raises(ValueError, match="share an address"):
        step_plan("j", [StepTask("n", "n", 1), StepTask("n", "n", 1)])


def test_the_step_preflight_names_each_node_and_what_is_wrong() -> None:
    assert step_problems([hello(0, "n0", 1), hello(1, "n1", 2)]) == ""
    problems = step_problems(
        [
            hello(0, "n0", 1, problems=("shared_dir /s does not exist",)),
            hello(1, "n1", 2, tensorflow=None),
            hello(2, "n2", 3, protocol=1, tensorflow="2.20.0"),
        ]
    )
    assert "n0: shared_dir /s does not exist" in problems
    assert "n1: TensorFlow is not installed for the node's python (3.11.2)" in problems
    assert "n2: its orchestrate worker package is another version (protocol 1" in problems
    assert "TensorFlow differs: n0=2.21.0, n1=None, n2=2.20.0" in problems
    # Trainers in an image (podman, Apptainer in the step): the node's own python needs none.
    bare = [hello(0, "n0", 1, tensorflow=None), hello(1, "n1", 2, tensorflow="2.20.0")]
    assert step_problems(bare, trainer_in_image=True) == ""


class ScriptedAllocation:
    """An allocation whose squeue answers are scripted: the requeue decision without Slurm."""

    def __init__(self, views: list[AllocationView], preempting: bool = False) -> None:
        self.id = "7"
        self.views = views
        self.preempted = preempting
        self.requeues = 0

    def view(self) -> AllocationView:
        return self.views.pop(0) if len(self.views) > 1 else self.views[0]

    def preempting(self) -> bool:
        return self.preempted

    def requeue(self) -> None:
        self.requeues += 1
        self.preempted = False


def ensure(
    tmp_path: Path, allocation: ScriptedAllocation, attempt: int, backend: str = ""
) -> list[str]:
    cfg = slurm_config(tmp_path, backend)
    assert isinstance(cfg.backend, SlurmBackend)
    hosts = SlurmHosts(cfg.backend)
    hosts.allocation = allocation  # type: ignore[assignment]
    said: list[str] = []
    layout = JobLayout(str(tmp_path), "job")
    assert hosts.ensure_running(cfg, "job", layout, attempt, said.append, said.append, Event())
    return said


RUNNING_LONG = AllocationView(SlurmState.RUNNING, time_left=3600.0)
RUNNING_ENDING = AllocationView(SlurmState.RUNNING, time_left=40.0)
QUEUED = AllocationView(SlurmState.PENDING, "BeginTime")


def test_a_restart_runs_in_the_allocation_while_it_has_time(tmp_path: Path) -> None:
    allocation = ScriptedAllocation([RUNNING_LONG])
    assert ensure(tmp_path, allocation, attempt=1) == []
    assert allocation.requeues == 0


def test_a_restart_near_the_time_limit_requeues_first_and_waits(tmp_path: Path) -> None:
    allocation = ScriptedAllocation([RUNNING_ENDING, QUEUED, RUNNING_LONG])
    said = ensure(tmp_path, allocation, attempt=1)
    assert allocation.requeues == 1
    assert said == [
        "Slurm job 7 requeued: 40s left of its time limit",
        "Slurm job 7: PENDING (BeginTime)",
    ]
    # The first attempt never requeues: its allocation has just started.
    assert ensure(tmp_path, ScriptedAllocation([RUNNING_ENDING]), attempt=0) == []


def test_a_restart_in_an_allocation_being_preempted_requeues_at_once(tmp_path: Path) -> None:
    allocation = ScriptedAllocation([RUNNING_LONG, QUEUED, RUNNING_LONG], preempting=True)
    said = ensure(tmp_path, allocation, attempt=2)
    assert allocation.requeues == 1
    assert said[0] == "Slurm job 7 requeued: is being preempted"


def test_without_requeue_an_ending_allocation_ends_the_job(tmp_path: Path) -> None:
    with pytest.raises(
        AllocationEnded, match=r"40s left of its time limit and backend\.requeue = false"
    ):
        ensure(tmp_path, ScriptedAllocation([RUNNING_ENDING]), attempt=1, backend="requeue = false")
    ended = ScriptedAllocation([AllocationView(SlurmState.TIMEOUT)])
    with pytest.raises(AllocationEnded, match="Slurm job 7 ended: TIMEOUT"):
        ensure(tmp_path, ended, attempt=1)


def test_pyxis_runs_every_task_of_the_step_in_the_image_with_the_shared_dir_mounted(
    tmp_path: Path,
) -> None:
    from orchestrator.backends.slurm_commands import dry_run_lines, slurm_task_argv
    from orchestrator.planning.task_specs import container_of

    extra = '[container]\nimage = "nvcr.io#nvidia/tensorflow:24.10"\nruntime = "pyxis"\n'
    cfg = slurm_config(tmp_path, extra=extra + 'mounts = ["/data:/data:ro"]\n')
    program = slurm_task_argv(cfg, "/s/.orchestrate/worker-0123")
    assert program[0] == "python3"  # the image's interpreter runs our task, then the trainer
    argv = srun_argv(cfg, "17", 0, "/s/attempt-0", "/s/tasks/%t/agent.log", program)
    shared = f"{tmp_path}/shared dir"
    assert "--container-image=nvcr.io#nvidia/tensorflow:24.10" in argv
    assert f"--container-mounts={shared}:{shared},{tmp_path}:{tmp_path},/data:/data:ro" in argv
    assert f"--container-workdir={tmp_path}" in argv
    assert argv.index("--container-image=nvcr.io#nvidia/tensorflow:24.10") < argv.index("python3")
    assert container_of(cfg, ()) is None  # the agent, already in the image, wraps nothing
    lines = dry_run_lines(cfg)
    assert any("--container-image=" in line for line in lines)
    assert not any(line.startswith("warm standbys") for line in lines)  # restarts are cold
