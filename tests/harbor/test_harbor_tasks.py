"""Real Harbor task directories as users bring them (fixtures/): the ones the local backend can
run faithfully pass `rollyard tasks check` (oracle 1, untouched 0); the ones whose Dockerfile it
cannot reproduce run in their own image on the docker backend (tests marked `docker`); the others
are refused at load, validation and `rollyard train` with their reason; a test.sh that cannot
install its tools is never a 0."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from batches import commit_batch, make_batch

from flows.cli import main
from storage import TrajectoryStore
from storage.gates import gate_iteration
from tasks_lib import TaskRefusedError, load_task, solution_changes, validate_task, verify

FIXTURES = Path(__file__).parent / "fixtures"
RUNNABLE = ("shell-greeting", "python-median", "service-health", "separate-sorter",
            "reward-json-csv")  # fmt: skip
CONTAINER = {
    "apt-jq": "environment/Dockerfile:2: runs 'apt-get update'",
    "separate-bc-verifier": 'environment/Dockerfile:3: runs "printf',
}
"""Tasks that bring their own image, and why the local environment does not stand for it."""
REFUSED = {
    "network-uv-install": "needs public network",
    "needs-gpu": "needs GPUs",
    "compose-redis": "starts compose services",
}


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLYARD_CACHE_DIR", str(tmp_path / "cache"))


def _check(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object]]:
    code = main(["tasks", "check", str(path)])
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("name", RUNNABLE)
def test_runnable_harbor_task_passes_the_oracle_check(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, summary = _check(FIXTURES / name, capsys)
    assert code == 0 and summary["ok"], summary
    assert summary["solution"] == {"reward": 1.0, "status": "ok", "flags": []}
    assert summary["untouched"] == {"reward": 0.0, "status": "ok", "flags": []}


@pytest.mark.parametrize(("name", "reason"), sorted(REFUSED.items()))
def test_task_needing_what_the_backend_lacks_is_refused_with_its_reason(
    name: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(TaskRefusedError, match=reason):
        load_task(FIXTURES / name)
    issues = validate_task(FIXTURES / name)
    assert any(reason in issue.message and issue.fix for issue in issues), issues
    code, summary = _check(FIXTURES / name, capsys)
    assert code != 0 and not summary["ok"] and "refused task" in str(summary["problems"])
    assert "solution" not in summary  # never run, never scored


def test_workspace_is_what_the_dockerfile_copies_to_workdir() -> None:
    task = load_task(FIXTURES / "reward-json-csv")
    assert task.workdir == "/app" and not task.has_rollyard_table
    assert sorted(p.name for p in task.snapshot_dir.iterdir()) == ["sales.csv"]
    assert task.harbor.environment.network.mode == "no-network"
    separate = load_task(FIXTURES / "separate-sorter")
    assert separate.harbor.verifier_mode == "separate" and separate.harbor.artifacts == ("/app",)


def test_reward_json_metrics_are_named_and_reward_is_primary() -> None:
    task = load_task(FIXTURES / "reward-json-csv")
    solved = verify(task, solution_changes(task))
    assert solved.reward == 1.0
    assert solved.metrics == {"reward": 1.0, "header": 1.0, "rows_matched": 1.0}
    untouched = verify(task)
    assert (untouched.status, untouched.reward) == ("ok", 0.0)
    assert untouched.metrics == {"reward": 0.0, "header": 0.0, "rows_matched": 0.0}


def test_test_sh_that_installs_as_root_is_a_verifier_error_not_a_zero(tmp_path: Path) -> None:
    """Task commands never run as root: a test.sh whose apt-get is refused for that, then writes
    0, judged the environment, not the candidate."""
    task_dir = Path(shutil.copytree(FIXTURES / "shell-greeting", tmp_path / "task"))
    (task_dir / "tests/test.sh").write_text(
        "#!/bin/bash\napt-get install -y bc\nmkdir -p /logs/verifier\n"
        "echo 0 > /logs/verifier/reward.txt\n"
    )
    result = verify(load_task(task_dir))
    assert (result.status, result.reward) == ("verifier_error", None), result.detail
    assert "are you root?" in result.detail


def test_reward_json_without_a_primary_metric_is_a_verifier_error(tmp_path: Path) -> None:
    task_dir = Path(shutil.copytree(FIXTURES / "shell-greeting", tmp_path / "task"))
    (task_dir / "tests/test.sh").write_text(
        '#!/bin/bash\nmkdir -p /logs/verifier\necho \'{"a": 1, "b": 0}\' > /logs/verifier/reward.json\n'
    )
    result = verify(load_task(task_dir))
    assert (result.status, result.reward) == ("verifier_error", None)
    assert "none is named 'reward'" in result.detail


def test_fake_zero_test_sh_that_cannot_install_its_tools_is_a_verifier_error(
    tmp_path: Path,
) -> None:
    """The fake zero: test.sh downloads uv, fails, and writes 0 anyway. That 0 judges the
    environment, not the candidate: verifier_error, no reward, and the gate counts it."""
    task = load_task(FIXTURES / "fake-zero-tools")
    verdicts = [verify(task), verify(task, solution_changes(task))]
    for verdict in verdicts:
        assert (verdict.status, verdict.reward) == ("verifier_error", None), verdict.detail
        assert "environment failed before a test could run" in verdict.detail
    store = TrajectoryStore(tmp_path / "store")
    rows = make_batch("run", 0, groups=10)
    for row in rows[:8]:  # two groups of this task's episodes
        row.update(status=str(verdicts[0].status), reward=verdicts[0].reward, passed=None)
    commit_batch(store, "run", 0, rows)
    report = gate_iteration(store, "run", 0)
    failed = {result.expectation: result for result in report.failed}
    assert "infra_error_rate" in failed and report.quarantined
    assert float(failed["infra_error_rate"].observed or "nan") == pytest.approx(8 / len(rows))


@pytest.mark.parametrize(("name", "reason"), sorted(CONTAINER.items()))
def test_task_whose_dockerfile_the_local_environment_lacks_gets_its_own_image(
    name: str, reason: str
) -> None:
    task = load_task(FIXTURES / name)
    assert task.container is not None and reason in task.container.reason
    assert task.container.context_dir == FIXTURES / name / "environment"
    separate = task.harbor.verifier_mode == "separate"
    assert (task.container.verifier_context_dir is not None) == separate
    assert task.workdir == "/app" and not validate_task(FIXTURES / name)
    # What the Dockerfile copies is the workspace; what its RUN lines make comes with the image.
    assert [p.name for p in task.snapshot_dir.iterdir()] == (["README.txt"] if not separate else [])


def test_own_image_without_an_engine_fails_the_check_loudly_never_a_score(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandboxes.docker_images import shared_client

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    shared_client.cache_clear()
    try:
        code, summary = _check(FIXTURES / "apt-jq", capsys)
    finally:
        shared_client.cache_clear()
    assert code != 0 and not summary["ok"] and "solution" not in summary
    assert "no Docker engine answers" in str(summary["problems"])
    assert "infra/docker/start-engine.sh" in str(summary["problems"])


@pytest.mark.slow
def test_rollyard_train_runs_the_runnable_fixtures_and_names_the_refused(
    tmp_path: Path, dask_address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A short `rollyard train` with the built-in policy over the fixture set (the tasks with
    their own image are in the docker test below): refused tasks are named with their reason and
    never run, the fake zero is a verifier_error, every other episode is scored."""
    tasks = tmp_path / "tasks"
    for fixture in FIXTURES.iterdir():
        if fixture.name not in CONTAINER:
            shutil.copytree(fixture, tasks / fixture.name)
    store = tmp_path / "store"
    code = main(["train", "--tasks", str(tasks), "--store", str(store), "--iterations", "1",
                 "--group-size", "2", "--tasks-per-iteration", "7", "--max-steps", "3",
                 "--shards", "2", "--dask-address", dask_address])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    for name, reason in REFUSED.items():
        assert f"refused task {name}: " in err and reason in err
    rows = TrajectoryStore(store).query("SELECT task_id, status, reward FROM episodes").to_pylist()
    assert {row["task_id"] for row in rows} == {*RUNNABLE, "fake-zero-tools"}
    for row in rows:
        if row["task_id"] == "fake-zero-tools":
            assert (row["status"], row["reward"]) == ("verifier_error", None)
        else:
            assert row["status"] == "ok" and row["reward"] in (0.0, 1.0), row


@pytest.mark.docker
@pytest.mark.parametrize("name", sorted(CONTAINER))
def test_own_image_task_passes_the_oracle_check_on_docker(
    name: str, engine: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code, summary = _check(FIXTURES / name, capsys)
    assert code == 0 and summary["ok"], summary
    assert summary["solution"] == {"reward": 1.0, "status": "ok", "flags": []}
    assert summary["untouched"] == {"reward": 0.0, "status": "ok", "flags": []}


@pytest.mark.docker
def test_own_image_is_built_once_and_the_agent_works_in_its_workdir(engine: None) -> None:
    import time

    from tasks_lib import open_task_sandbox, task_image

    task = load_task(FIXTURES / "separate-bc-verifier")
    agent_image = task_image(task)
    started = time.monotonic()
    assert task_image(task) == agent_image  # cached by content: no rebuild
    assert time.monotonic() - started < 5.0
    assert task_image(task, verifier=True) != agent_image
    with open_task_sandbox(task) as sandbox:
        shown = sandbox.execute("pwd -P; cat numbers.txt; command -v bc || echo no-bc; id -u")
        assert shown.stdout.split() == ["/workspace", "17", "25", "no-bc", "1000"]
        assert sandbox.execute("cat /app/numbers.txt").stdout == "17\n25\n"
    with open_task_sandbox(task, verifier=True) as sandbox:
        assert sandbox.execute("command -v bc").stdout.strip() == "/usr/bin/bc"
        assert sandbox.execute("cat /proc/net/dev | tail -n +3 | cut -d: -f1").stdout.split() == [
            "lo"
        ]


@pytest.mark.docker
def test_own_image_holds_the_escape_cases_bwrap_holds(engine: None) -> None:
    """In a task's own image (its Dockerfile ran apt-get as root at build time), task commands
    run unprivileged: uid 1000, no capabilities, no network, no writes outside the workspace, no
    mount or namespace tricks, no engine socket, no host directory mounted."""
    from tasks_lib import open_task_sandbox

    with open_task_sandbox(load_task(FIXTURES / "apt-jq")) as sandbox:

        def run(command: str) -> tuple[int, str]:
            result = sandbox.execute(command)
            return result.exit_code, result.stdout.strip()

        assert run("id -u; grep CapEff /proc/self/status | cut -f2") == (
            0,
            "1000\n0000000000000000",
        )
        assert run("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '") == (0, "lo")
        assert run("getent hosts deb.debian.org")[0] != 0
        probe = "import socket; socket.create_connection(('10.0.0.1', 80), timeout=2)"
        assert "unreachable" in sandbox.execute(["python3", "-c", probe]).stderr
        for attack in ("touch /etc/x", "touch /usr/bin/jq", "cat /etc/shadow",
                       "mount -t tmpfs none /mnt", "unshare -r true", "unshare -m true",
                       "test -e /var/run/docker.sock", "su -c true root </dev/null"):  # fmt: skip
            assert run(attack)[0] != 0, attack
        # Mount roots: the image's own tree, kernel filesystems, and the three per-container
        # files Docker writes (hosts, hostname, resolv.conf); never a host directory.
        for line in run("cut -d' ' -f4,5 /proc/self/mountinfo")[1].splitlines():
            root, point = line.split()
            assert (
                root in ("/", "/bus", "/fs", "/irq", "/sys", "/null")
                or root.startswith("/docker/")
                or point in ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf")
            ), line
        assert sandbox.execute("jq -n 1").stdout.strip() == "1"  # the image's tools do run


@pytest.mark.slow
def test_reward_json_task_run_end_to_end_stores_its_named_rewards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reward-json-csv task rolled out and committed: every metric of its reward.json lands
    in the episodes table's `rewards`, `reward` is the primary one, and `rollyard query` (the
    named query and SQL) and `rollyard export` show them."""
    import pyarrow.parquet as pq

    from training.actions import RunCommand
    from training.local import rollout_batch
    from training.policy import ScriptedPolicy

    task = tmp_path / "tasks" / "reward-json-csv"
    shutil.copytree(FIXTURES / "reward-json-csv", task)
    # The header and two of three rows, out of order: named rewards 1, 2/3 and a primary 0.
    partial = RunCommand("printf 'name,total\\nbo,7\\nal,3\\n' > totals.csv")
    store = TrajectoryStore(tmp_path / "store")
    trajectories = rollout_batch([task], store, policy=ScriptedPolicy([partial]), run_id="named",
                                 iteration=0, tasks_per_iteration=1, group_size=2, max_steps=2)  # fmt: skip
    assert [t.status for t in trajectories] == ["ok", "ok"], [t.error for t in trajectories]
    expected = {"reward": 0.0, "header": 1.0, "rows_matched": 2 / 3}
    rows = store.query("SELECT reward, rewards, rewards['rows_matched'] AS rows_matched "
                       "FROM episodes").to_pylist()  # fmt: skip
    assert len(rows) == 2
    for row in rows:
        assert row["reward"] == 0.0 and dict(row["rewards"]) == expected
        assert row["rows_matched"] == pytest.approx(2 / 3)

    assert main(["query", "--store", store.root, "--format", "json", "--named",
                 "named_rewards"]) == 0  # fmt: skip
    named = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["metric"]: (r["episodes"], r["mean"]) for r in named} == {
        name: (2, pytest.approx(value)) for name, value in expected.items()
    }

    out = tmp_path / "export"
    code = main(["export", "--store", store.root, "--layout", "hf", "--out", str(out),
                 "--include-masked"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    exported = pq.read_table(out / "train.parquet", columns=["rewards"]).to_pylist()
    assert [{m["name"]: m["value"] for m in r["rewards"]} for r in exported] == [expected] * 2


def _pulled_image_task(root: Path, image: str) -> Path:
    """A Harbor task that names a pre-built image and has no Dockerfile (nor environment/)."""
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test.sh").write_text(
        "mkdir -p /logs/verifier\n"
        'if [ "$(cat /srv/work/answer.txt 2>/dev/null)" = 42 ]; then echo 1; else echo 0; fi'
        " > /logs/verifier/reward.txt\n"
    )
    (root / "solution").mkdir()
    (root / "solution" / "solve.sh").write_text("echo 42 > /srv/work/answer.txt\n")
    (root / "instruction.md").write_text("Write 42 into answer.txt.\n")
    (root / "task.toml").write_text(
        f'version = "1.0"\n\n[environment]\ndocker_image = "{image}"\nworkdir = "/srv/work"\n'
        'network_mode = "no-network"\n'
    )
    return root


def test_docker_image_task_loads_to_run_in_that_image(tmp_path: Path) -> None:
    task = load_task(_pulled_image_task(tmp_path / "pulled", "registry.example.com/tools:1"))
    assert task.container is not None
    assert task.container.pulled_image == "registry.example.com/tools:1"
    assert task.workdir == "/srv/work" and list(task.snapshot_dir.iterdir()) == []


@pytest.mark.docker
def test_docker_image_is_pulled_or_refused_in_one_line(
    engine: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`docker_image` without a Dockerfile: an image the engine holds (here the base image under
    a registry name, as `docker load` leaves it) runs the task; one that cannot be pulled fails
    the check with how to provide it, never a score."""
    from sandboxes.docker_images import base_image, shared_client

    local = "registry.example.com/rollyard-test/tools:1"
    shared_client().images.get(base_image()).tag(local)
    code, summary = _check(_pulled_image_task(tmp_path / "present", local), capsys)
    assert code == 0 and summary["ok"], summary
    assert summary["solution"]["reward"] == 1.0 and summary["untouched"]["reward"] == 0.0
    code, summary = _check(_pulled_image_task(tmp_path / "absent", "registry.invalid/no:1"), capsys)
    assert code != 0 and not summary["ok"] and "solution" not in summary
    problems = " ".join(map(str, summary["problems"]))  # type: ignore[call-overload]
    assert "cannot pull the task's image registry.invalid/no:1" in problems, problems
    assert "docker load" in problems and "no such host" in problems, problems
