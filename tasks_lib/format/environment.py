"""Where a task's episodes and its verifier run: a sandbox over its workspace on the backend
asked for, or, for a task that brings its own image (`Task.container`), on the docker backend in
that image, built once per content digest of its build context."""

from __future__ import annotations

from sandboxes import Sandbox, open_sandbox
from tasks_lib.format.model import Task


def task_image(task: Task, *, verifier: bool = False) -> str | None:
    """The tag of the task's own image (the verifier's, for a separate verifier with its own
    `tests/Dockerfile`), built when missing; None for a task that runs on bwrap's environment.

    The tag is a hash of the base image, the Dockerfile and its context: the same content gives
    the same image, reused across episodes and runs."""
    container = task.container
    if container is None:
        return None
    from sandboxes.docker_images import harbor_task_image, pulled_task_image

    if container.repository is not None:
        from tasks_lib.format.repository import repository_image

        return repository_image(
            container.repository, task.snapshot_dir,
            build_timeout_s=task.harbor.environment.build_timeout_s,
        ).instance  # fmt: skip
    if container.pulled_image is not None and not (
        verifier and container.verifier_context_dir is not None
    ):
        return pulled_task_image(container.pulled_image, task.harbor.environment.workdir)
    context = container.context_dir
    if verifier and container.verifier_context_dir is not None:
        context = container.verifier_context_dir
    return harbor_task_image(
        context, task.workdir, build_timeout_s=task.harbor.environment.build_timeout_s
    )


def open_task_sandbox(task: Task, backend: str = "bwrap", *, verifier: bool = False) -> Sandbox:
    """A fresh sandbox over the task's pristine workspace: on `backend`, or in the task's own image
    on the docker backend when it has one (whatever `backend` says: only that image runs it
    faithfully)."""
    image = task_image(task, verifier=verifier)
    limits = task.limits
    if verifier:
        # The verifier's own network policy (Harbor lets it differ from the agent's).
        limits = limits.replace(allowed_hosts=task.harbor.verifier_network_policy.egress_hosts)
    if image is None:
        return open_sandbox(task.snapshot_dir, backend=backend, limits=limits)
    return open_sandbox(task.snapshot_dir, backend="docker", limits=limits, image=image)
