"""The job verbs of the ``danaus`` command, driven as a person would: ``danaus apply``
starts a job a later command finds in ``.monarch/``, ``danaus exec`` runs commands on its
hosts, ``info`` and ``kill``, and named contexts; and ``exec_command`` itself."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from danaus.job import (
    LocalJob,
    ProcessJob,
    exec_command,
    job_load,
    load_current_job,
    set_current_job,
    shell,
)

from .test_robustness import _wait_gone

pytestmark = pytest.mark.timeout(180)


def danaus(cwd: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``danaus ARGS`` in ``cwd``, as typed in a shell there."""
    return subprocess.run(
        [sys.executable, "-m", "danaus", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "myjob.py").write_text(
        textwrap.dedent(
            """
            from danaus.job import LocalJob, ProcessJob

            job = ProcessJob({"hosts": 2, "workers": 1})
            here = LocalJob(("hosts",))
            not_a_job = 42
            """
        )
    )
    yield tmp_path
    for saved in (tmp_path / ".monarch").glob("*/state.pkl"):  # whatever a test left
        job_load(str(saved)).kill()


def worker_pids(project: Path) -> list[int]:
    saved = job_load(str(project / ".monarch" / "job_state.pkl"))
    assert isinstance(saved, ProcessJob)
    return list(saved._pids.values())


def test_apply_exec_info_and_kill_a_job_of_local_hosts(project: Path) -> None:
    applied = danaus(project, "apply", "myjob.job")
    assert applied.returncode == 0, applied.stderr
    assert (
        "Job is ready" in applied.stdout and "hosts (2 hosts), workers (1 host)" in applied.stdout
    )
    pids = worker_pids(project)
    try:
        # the job outlived `danaus apply`: its three workers serve the next commands
        assert len(pids) == 3 and _wait_gone(pids, 0.1) == pids
        assert (project / ".monarch" / "default" / "spec").read_text().strip() == "myjob.job"

        info = danaus(project, "info")
        assert info.returncode == 0
        assert "context: default" in info.stdout and "spec: myjob.job (a ProcessJob)" in info.stdout
        assert "job: running" in info.stdout and "hosts: 2 hosts" in info.stdout

        # default target: rank 0 of the first mesh, output here, in the caller's folder
        one = danaus(project, "exec", "--", "sh", "-c", "echo hi $MONARCH_RANK_procs; pwd")
        assert one.returncode == 0, one.stderr
        assert one.stdout.splitlines() == ["hi 0", str(project)]

        point = danaus(
            project, "exec", "--point", "hosts=1", "--per-host", "gpus=2", "-e", "X=ü \\x",
            "sh", "-c", "echo $X $MONARCH_RANK_gpus/$MONARCH_SIZE_gpus",
        )  # fmt: skip
        assert point.returncode == 0, point.stderr
        assert point.stdout.splitlines() == ["ü \\x 0/2", "ü \\x 1/2"]

        # every host: output to files on the hosts (here, this machine), a folder per rank
        every = danaus(project, "exec", "--all", "sh", "-c", "echo $MONARCH_RANK_hosts; exit 4")
        assert every.returncode == 4
        base = Path(every.stdout.split("Output -> ")[1].split("/<mesh>")[0])
        outputs = {str(p.relative_to(base)): p.read_text() for p in base.glob("*/*/stdout.txt")}
        assert outputs == {
            "hosts/hosts_0_procs_0/stdout.txt": "0\n",
            "hosts/hosts_1_procs_0/stdout.txt": "1\n",
            "workers/hosts_0_procs_0/stdout.txt": "0\n",
        }

        script = danaus(project, "exec", "--script", "-", stdin="echo from $0 stdin\n")
        assert script.returncode == 0 and "stdin" in script.stdout

        missing = danaus(project, "exec", "no-such-command-here")
        assert missing.returncode == 127 and "no-such-command-here" in missing.stderr

        wrong = danaus(project, "exec", "--mesh", "nope", "true")
        assert wrong.returncode != 0 and "no mesh 'nope'" in wrong.stderr
        assert "hosts, workers" in wrong.stderr
        assert _wait_gone(pids, 0.1) == pids  # none of that hurt the job
    finally:
        killed = danaus(project, "kill")
    assert killed.returncode == 0 and "Killed the job" in killed.stdout
    assert _wait_gone(pids, 15) == []
    assert "job: not applied" in danaus(project, "info").stdout


def test_exec_kill_ends_the_job_and_keeps_the_context(project: Path) -> None:
    assert danaus(project, "apply", "myjob.job").returncode == 0
    pids = worker_pids(project)
    ran = danaus(project, "exec", "--kill", "true")
    assert ran.returncode == 0, ran.stderr
    assert _wait_gone(pids, 15) == []
    info = danaus(project, "info").stdout
    assert "context: default" in info and "job: not applied" in info
    assert danaus(project, "context", "ls").stdout.splitlines() == ["* default"]


def test_contexts_keep_one_job_each(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert danaus(project, "context", "ls").stdout.strip() == "No contexts."
    assert danaus(project, "apply", "myjob.here").returncode == 0
    assert danaus(project, "context", "create", "exp").returncode == 0
    used = danaus(project, "context", "use", "exp")
    assert used.stdout.strip() == "Switched to context 'exp'"
    assert danaus(project, "context", "ls").stdout.splitlines() == ["  default", "* exp"]
    # a new context has no spec yet
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    with pytest.raises(FileNotFoundError, match="danaus apply"):
        load_current_job()
    assert danaus(project, "apply", "myjob.job").returncode == 0
    pids = worker_pids(project)
    assert isinstance(load_current_job(), ProcessJob)
    # the default context still holds its own job
    assert danaus(project, "context", "use", "default").returncode == 0
    assert isinstance(load_current_job(), LocalJob)
    ran = danaus(project, "exec", "python", "-c", "print('local')")
    assert ran.returncode == 0 and ran.stdout == "local\n"
    # removing a context ends its job
    removed = danaus(project, "context", "rm", "exp")
    assert removed.returncode == 0
    assert _wait_gone(pids, 15) == []
    assert danaus(project, "context", "ls").stdout.splitlines() == ["* default"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["apply", "nosuchmodule.job"], "No module named 'nosuchmodule'"),
        (["apply", "myjob.absent"], "has no 'absent'"),
        (["apply", "myjob.not_a_job"], "is an int, not a job"),
        (["apply", "nodot"], "is 'module.attr'"),
        (["exec", "true"], "run 'danaus apply <module.attr>' first"),
        (["context", "create", "../outside"], "one plain folder name"),
        (["kill", "nosuch"], "no context named 'nosuch'"),
        (["exec", "--point", "hosts", "true"], "a point is DIM=N"),
    ],
)
def test_mistakes_are_named(project: Path, args: list[str], says: str) -> None:
    done = danaus(project, *args)
    assert done.returncode != 0
    assert says in done.stderr
    assert not (project.parent / "outside").exists()


def workers_running() -> set[int]:
    """Pids of the ProcessJob workers running on this machine, whoever started them."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and b"run_worker_loop_forever" in (entry / "cmdline").read_bytes()
            ):
                found.add(int(entry.name))
        except OSError:
            pass
    return found


@pytest.fixture
def spec_only(project: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project whose spec is recorded and whose job does not run (as after
    ``danaus apply myjob.job; danaus kill``)."""
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    set_current_job("myjob.job")
    return project


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--mesh", "nope"], "no mesh 'nope' in the job; its meshes: hosts, workers"),
        (["--per-host", "gpus=0"], "per_host['gpus'] must be a positive int, got 0"),
        (["--per-host", "hosts=2"], "dim 'hosts' is already a dim of the host mesh"),
        (["--all", "--per-host", "gpus=-1"], "per_host['gpus'] must be a positive int, got -1"),
        (["--point", "hosts=7"],
         "--point hosts=7: index 7 is out of range for dim 'hosts' of size 2"),
        (["--point", "gpus=0"],
         "--point gpus=0: unknown dims ['gpus']; Shape({'hosts': 2}) has dims ['hosts']"),
    ],
)  # fmt: skip
def test_exec_names_a_bad_target_in_one_line_and_starts_nothing(
    spec_only: Path, args: list[str], says: str
) -> None:
    before = workers_running()
    done = danaus(spec_only, "exec", *args, "hostname")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"danaus exec: {says}"]
    assert "job: not applied" in danaus(spec_only, "info").stdout
    assert workers_running() - before == set()


def test_exec_says_when_it_starts_the_job_and_a_host_sees_its_rank(spec_only: Path) -> None:
    done = danaus(
        spec_only, "exec", "--point", "hosts=1", "sh", "-c",
        "echo $MONARCH_RANK_hosts/$MONARCH_SIZE_hosts $MONARCH_RANK_procs/$MONARCH_SIZE_procs",
    )  # fmt: skip
    try:
        assert done.returncode == 0, done.stderr
        assert done.stdout == "1/2 0/1\n"  # host 1 of 2, as a run on every host sees it
        assert done.stderr.splitlines() == [
            "danaus exec: the job of context 'default' was not running: started it "
            "(hosts (2 hosts), workers (1 host)); it keeps running until 'danaus kill'"
        ]
        assert "job: running" in danaus(spec_only, "info").stdout
        again = danaus(spec_only, "exec", "true")  # running now: nothing to say
        assert again.returncode == 0 and again.stderr == ""
    finally:
        assert danaus(spec_only, "kill").returncode == 0


def test_context_use_refuses_an_unknown_context(project: Path) -> None:
    assert danaus(project, "context", "create", "exp").returncode == 0
    assert danaus(project, "context", "use", "exp").returncode == 0
    done = danaus(project, "context", "use", "nosuch")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "danaus context: no context named 'nosuch' (its contexts: exp); "
        "'danaus context create nosuch' makes it"
    ]
    assert danaus(project, "context", "ls").stdout.splitlines() == ["* exp"]
    assert not (project / ".monarch" / "nosuch").exists()


async def test_exec_command_on_a_flat_rank_sees_the_rank_of_each_dim(tmp_path: Path) -> None:
    job = ProcessJob({"hosts": 2})
    try:
        hosts = job.state().hosts
        out = tmp_path / "out"
        rc = await exec_command(
            hosts, ["sh", "-c", "echo $MONARCH_RANK_hosts/$MONARCH_SIZE_hosts"], rank=1,
            output_dir=f"{out}/$SUBDIR",
        )  # fmt: skip
        assert rc == 0
        assert [p.read_text() for p in out.glob("*/stdout.txt")] == ["1/2\n"]
        with pytest.raises(IndexError, match="rank 2 is out of range for a mesh of 2"):
            exec_command(hosts, ["true"], rank=2)
    finally:
        job.kill()


async def test_exec_command_reports_each_runs_outcome(tmp_path: Path) -> None:
    hosts = LocalJob().state().hosts
    out = tmp_path / "out"
    rc = await exec_command(
        hosts, ["sh", "-c", "echo $MONARCH_RANK_gpus; exit $MONARCH_RANK_gpus"],
        output_dir=f"{out}/$SUBDIR", per_host={"gpus": 3},
    )  # fmt: skip
    assert rc == 2  # the highest exit status
    assert sorted(p.parent.name for p in out.glob("*/stdout.txt")) == [
        "gpus_0",
        "gpus_1",
        "gpus_2",
    ]
    assert (out / "gpus_1" / "stdout.txt").read_text() == "1\n"
    with pytest.raises(subprocess.TimeoutExpired):
        await exec_command(hosts, ["sleep", "30"], timeout=0.5)
    with pytest.raises(ValueError, match="rank or point"):
        exec_command(hosts, ["true"], rank=0, point={})


def test_shell_is_a_terminal_on_one_host(project: Path) -> None:
    assert danaus(project, "apply", "myjob.job").returncode == 0
    pids = worker_pids(project)
    try:
        term = pexpect.spawn(
            sys.executable,
            ["-m", "danaus", "shell", "--point", "hosts=1", "-e", "FOO=ü bar"],
            cwd=str(project),
            timeout=60,
            encoding="utf-8",
            dimensions=(40, 100),
        )
        term.expect([r"\$ ", "# "])  # the remote shell's prompt
        term.sendline("echo X$FOO-$MONARCH_RANK_procs; tty; stty size; pwd")
        term.expect("Xü bar-0")
        term.expect("/dev/pts/")  # a terminal of its own over there
        term.expect("40 100")  # the size of ours
        term.expect(str(project))  # started in the folder the command was typed in
        term.setwinsize(50, 120)  # the window follows
        term.sendline("stty size")
        term.expect("50 120")
        # the ^C is sent once the sleep has begun: the process that prints "sleeping"
        # ("sle""eping" as typed; one word only when run) becomes the sleep, in the
        # terminal's foreground. Sent while the remote shell still read the line, a loaded
        # machine once lost it to the line's editing; sent between a builtin echo and the
        # sleep bash forks after it, bash took it and left $? at the echo's 0
        term.sendline("sh -c 'echo sle\"\"eping; exec sleep 30'")
        term.expect("sleeping")
        term.sendintr()  # ^C reaches the remote shell, not this program
        term.sendline("echo after-$?")  # the sleep ended by SIGINT: status 128 + 2
        term.expect("after-130")
        # a flood of output (past the flow-control window) arrives whole, in order
        term.sendline("seq 1 300000; echo flood-done")
        term.expect("299999\r\n300000\r\n", timeout=60)
        term.expect("flood-done")
        term.sendline("exit 3")
        term.expect(pexpect.EOF)
        term.close()
        assert term.exitstatus == 3
        assert _wait_gone(pids, 0.1) == pids  # the job lives on

        # the hosts go while a shell is open: it ends, saying so
        term = pexpect.spawn(
            sys.executable, ["-m", "danaus", "shell"], cwd=str(project), timeout=60
        )
        term.expect([rb"\$ ", b"# "])
        assert danaus(project, "kill").returncode == 0
        term.expect(pexpect.EOF)
        term.close()
        assert term.exitstatus == 1
        assert b"danaus shell:" in (term.before or b"")
    finally:
        danaus(project, "kill")
    assert _wait_gone(pids, 15) == []


def test_shell_needs_one_host() -> None:
    job = ProcessJob({"hosts": 2})
    try:
        with pytest.raises(ValueError, match="one host; this host mesh has 2"):
            shell(job.state().hosts)
    finally:
        job.kill()


def test_a_jobs_services_come_up_with_its_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Monarch's enable_admin / enable_telemetry: the admin endpoint, telemetry in the
    controller and in the procs spawned from then on, and the dashboard's page."""
    import urllib.request

    import danaus
    from danaus.config import clear_runtime_config, runtime_env
    from danaus.job import MeshAdminConfig, TelemetryConfig

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    plain = LocalJob().state()
    assert (plain.admin_url, plain.telemetry_url, plain.dashboard_url) == (None, None, None)
    job = LocalJob(("hosts",)).enable_admin(MeshAdminConfig())
    state = job.state()
    assert state.admin_url is not None and state.admin_url == danaus.serve_admin().addr
    try:
        job = LocalJob(("hosts",)).enable_telemetry(
            TelemetryConfig(include_dashboard=True, dashboard_port=0)
        )
        assert job.enable_telemetry(include_dashboard=True, dashboard_port=0) is job
        state = job.state()
        assert danaus.config.telemetry and runtime_env()["DANAUS_TELEMETRY"] == "1"
        assert state.telemetry_url is None  # (exporting nowhere, as the variables say)
        assert state.admin_url == danaus.serve_admin().addr  # telemetry brings the admin
        assert state.dashboard_url is not None
        with urllib.request.urlopen(state.dashboard_url, timeout=30) as page:
            assert page.status == 200 and b"danaus" in page.read().lower()
        with pytest.raises(TypeError):
            LocalJob().enable_telemetry(no_such_field=1)
    finally:
        clear_runtime_config()
    assert not danaus.config.telemetry
