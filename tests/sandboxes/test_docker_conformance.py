"""The conformance suite on the Docker backend, plus its image layering. Needs an engine:
`eval "$(infra/docker/start-engine.sh)"` first (see infra/docker/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxes import Limits, Sandbox
from tests.sandboxes.test_conformance import OpenBackend, SandboxConformance, make_snapshot

pytestmark = pytest.mark.docker


class TestDockerConformance(SandboxConformance):
    @pytest.fixture
    def open_backend(self, engine: None) -> OpenBackend:
        from sandboxes.docker import DockerSandbox

        def open_docker(snapshot: Path, *, limits: Limits | None = None) -> Sandbox:
            return DockerSandbox(snapshot, limits=limits)

        return open_docker


def test_network_is_off_and_commands_run_unprivileged(engine: None, tmp_path: Path) -> None:
    from sandboxes import open_sandbox

    with open_sandbox(make_snapshot(tmp_path / "s"), backend="docker") as sandbox:
        result = sandbox.execute("cat /proc/net/dev | tail -n +3 | cut -d: -f1; id -u")
        assert result.stdout.split() == ["lo", "1000"]
        assert sandbox.execute("touch /etc/x").exit_code != 0


def test_daemons_do_not_outlive_the_command(engine: None, tmp_path: Path) -> None:
    from sandboxes import open_sandbox

    with open_sandbox(make_snapshot(tmp_path / "s"), backend="docker") as sandbox:
        sandbox.execute("setsid sh -c 'sleep 300' >/dev/null 2>&1 &")
        listing = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done"
        assert "sleep 300" in sandbox.execute(f"sleep 300 & {listing}").stdout
        assert "sleep 300" not in sandbox.execute(listing).stdout


def test_layers_are_keyed_by_what_built_them(engine: None, tmp_path: Path) -> None:
    from sandboxes.docker import DockerSandbox
    from sandboxes.docker_images import base_image, ensure_layer, harbor_task_image

    family = ensure_layer(base_image(), "FROM scratch\nRUN echo family > /opt/family.txt\n").tag
    again = ensure_layer(base_image(), "FROM scratch\nRUN echo family > /opt/family.txt\n")
    assert again.tag == family and not again.built
    assert ensure_layer(base_image(), "FROM x\nRUN echo other > /opt/family.txt\n").tag != family
    env = tmp_path / "environment"
    env.mkdir()
    (env / "marker.txt").write_text("from the task's Dockerfile\n")
    (env / "Dockerfile").write_text(
        "FROM python:3.11-slim\nCOPY marker.txt /opt/marker.txt\nWORKDIR /workspace\n"
    )
    image = harbor_task_image(env, base=family)
    snapshot = make_snapshot(tmp_path / "s")
    with DockerSandbox(snapshot, image=image) as sandbox:
        out = sandbox.execute("cat /opt/family.txt /opt/marker.txt && python -m pytest -q tests")
        assert out.stdout.startswith("family\nfrom the task's Dockerfile\n")
        assert "1 passed" in out.stdout
        first = sandbox.image
    with DockerSandbox(snapshot, image=image) as again:
        assert again.image == first  # same parent + same snapshot: the task layer is reused


def test_containers_are_removed(engine: None, tmp_path: Path) -> None:
    from sandboxes.docker import DockerSandbox
    from sandboxes.docker_images import LABEL, shared_client

    client = shared_client()
    before = {c.id for c in client.containers.list(all=True, filters={"label": LABEL})}
    sandbox = DockerSandbox(make_snapshot(tmp_path / "s"))
    sandbox.reset()
    sandbox.close()
    after = {c.id for c in client.containers.list(all=True, filters={"label": LABEL})}
    assert after <= before


def test_a_task_verifies_on_the_docker_backend(engine: None, tmp_path: Path) -> None:
    from tasks_lib import generate_demo_tasks, load_task, solution_changes, verify

    task = load_task(generate_demo_tasks(tmp_path / "tasks", 1, seed=5)[0])
    solved = verify(task, solution_changes(task, backend="docker"), backend="docker")
    untouched = verify(task, None, backend="docker")
    assert (solved.status, solved.reward) == ("ok", 1.0), solved.detail
    assert (untouched.status, untouched.reward) == ("ok", 0.0), untouched.detail


def test_a_file_the_command_made_unreadable_is_the_commands_doing(
    engine: None, tmp_path: Path
) -> None:
    from sandboxes import SandboxError, open_sandbox
    from tasks_lib.errors import CandidateBoundsError
    from tasks_lib.verify.candidate import CandidateChanges

    with open_sandbox(make_snapshot(tmp_path / "s"), backend="docker") as sandbox:
        assert sandbox.execute("echo '# x' >> calc.py && chmod 000 calc.py").exit_code == 0
        for read in (sandbox.read_file, lambda p: sandbox.read_file_ends(p, max_bytes=100)):
            with pytest.raises(PermissionError) as raised:
                read("calc.py")
            assert not isinstance(raised.value, SandboxError)  # an observation, not infra
        with pytest.raises(CandidateBoundsError, match="not readable"):
            CandidateChanges.from_sandbox(sandbox)
