"""Synthesis: inject bugs into a real Python project, keep the ones its own tests catch reliably,
and write each as a Harbor task.

A mutant is kept only when the original suite passes (three runs, same outcomes), the mutant
fails at least one of those tests and leaves others passing, and a second run of the mutant fails
the same tests with the same messages. Tests are named by pytest's own node ids; a parametrized
test whose ids change from run to run (parametrized over a set) is left out of every task, and a
mutant dropped as unstable carries the tests that flipped and why. Mutants that break the same
tests the same way are one task.
Mutants are evaluated in batches; with an `executor` (a `concurrent.futures.Executor` or a Dask
`distributed.Client`, anything with `submit(fn, *args)`) the batches run in parallel, and the
result is the same as a sequential run: mutants are decided in a fixed order.
"""

from __future__ import annotations

import dataclasses
import random
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol

from sandboxes import Limits, SandboxError, open_sandbox
from tasks_lib.errors import GenerationError
from tasks_lib.format.loader import load_task
from tasks_lib.format.node_ids import checkable_test_ids
from tasks_lib.sources.synthesize.mutants import (
    MutantResult,
    Verdict,
    failing_tests,
    flipped_tests,
    unstable_entry,
    unstable_reason,
)
from tasks_lib.sources.synthesize.operators import OPERATORS, ModuleMutator, SourceMutation
from tasks_lib.sources.synthesize.project import (
    ProjectLayout,
    add_src_shim,
    copy_clean,
    inspect_project,
)
from tasks_lib.sources.synthesize.task_writer import write_synthesized_task
from tasks_lib.verify import PytestRun, check_task, run_pytest

BASELINE_RUNS = 3
"""Runs of the original suite: three, so that a parametrization over a small set (whose ids
follow its per-process order) almost surely shows different ids in two of them."""
MAX_LISTED_FLIPS = 5


class Submitter(Protocol):
    """What synthesis needs of an executor: `concurrent.futures.Executor` and
    `distributed.Client` both fit."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any: ...


@dataclasses.dataclass(frozen=True, slots=True)
class SynthesisReport:
    project: str
    mutants_tried: int
    tasks_kept: int
    duplicates: int
    verdicts: Mapping[str, int]
    kept_by_operator: Mapping[str, int]
    baseline_tests: int
    """Tests that pass on the original in every baseline run."""
    duration_s: float
    task_dirs: tuple[str, ...]
    check_failures: tuple[str, ...] = ()
    """Tasks dropped because the oracle check failed (id: first problem)."""
    unstable: tuple[Mapping[str, Any], ...] = ()
    """Every mutant dropped as unstable: the mutation, why, and the tests that flipped."""
    flaky_baseline: tuple[str, ...] = ()
    """Tests of the original suite that pass in some baseline runs and not others (left out)."""
    varying_ids: tuple[str, ...] = ()
    """Tests (ids without their parametrization) whose parametrized ids differ between runs of
    the original suite, e.g. parametrized over a set: no run can name them, so no task uses them."""
    hardlinks_left_out: tuple[str, ...] = ()
    """Project files not copied into any task: hard links whose other names lie outside it."""

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["verdicts"] = dict(self.verdicts)
        data["kept_by_operator"] = dict(self.kept_by_operator)
        data["duration_s"] = round(self.duration_s, 2)
        data["unstable"] = [dict(entry) for entry in self.unstable]
        return data


# -- evaluating mutants (runs on workers: module-level, picklable arguments) ------------------------


def evaluate_mutants(
    workspace: str,
    test_paths: tuple[str, ...],
    baseline: tuple[str, ...],
    checkable: tuple[str, ...],
    mutations: tuple[SourceMutation, ...],
    *,
    backend: str = "bwrap",
    limits: Limits | None = None,
    timeout_s: float = 60.0,
    stability_runs: int = 2,
    max_fail_to_pass: int | None = None,
) -> list[MutantResult]:
    """Run the suite on each mutant of `workspace` (one sandbox, reset between mutants); a mutant
    failing more than `max_fail_to_pass` tests is `too_broad` (None: no bound)."""
    root = Path(workspace)
    checkable_set = set(checkable)
    results: list[MutantResult] = []
    with open_sandbox(root, backend=backend, limits=limits or Limits()) as sandbox:
        for mutation in mutations:
            started = time.monotonic()
            mutated = mutation.apply((root / mutation.path).read_bytes())
            runs: list[dict[str, str]] = []
            verdict: Verdict | None = None
            for _ in range(stability_runs):
                sandbox.write_file(mutation.path, mutated)
                run = run_pytest(sandbox, test_paths, timeout_s=timeout_s)
                sandbox.reset()
                if run.broken:
                    verdict = "timeout" if run.limit == "wall_time" else "broken"
                    break
                failing = failing_tests(run, baseline)
                runs.append(failing)
                if not failing:
                    verdict = "survived"
                    break
                if len(failing) == len(baseline):
                    verdict = "breaks_everything"
                    break
                if runs[0] != failing:
                    verdict = "unstable"
                    break
            duration_s = time.monotonic() - started
            if verdict == "unstable":
                flips = flipped_tests(runs[0], runs[-1])
                results.append(
                    MutantResult(
                        mutation,
                        verdict,
                        duration_s=duration_s,
                        flips=flips[:MAX_LISTED_FLIPS],
                        why=unstable_reason(flips),
                    )
                )
                continue
            if verdict is not None:
                results.append(MutantResult(mutation, verdict, duration_s=duration_s))
                continue
            failing = runs[0]
            fail_to_pass = tuple(sorted(t for t in failing if t in checkable_set))
            pass_to_pass = tuple(t for t in baseline if t not in failing and t in checkable_set)
            if not fail_to_pass or not pass_to_pass:
                results.append(MutantResult(mutation, "unverifiable", duration_s=duration_s))
                continue
            if max_fail_to_pass is not None and len(fail_to_pass) > max_fail_to_pass:
                results.append(MutantResult(mutation, "too_broad", duration_s=duration_s))
                continue
            results.append(
                MutantResult(
                    mutation,
                    "kept",
                    fail_to_pass,
                    pass_to_pass,
                    tuple(sorted(failing.items())),
                    duration_s,
                )
            )
    return results


# -- choosing mutants -----------------------------------------------------------------------------


def candidate_mutations(
    workspace: Path, layout: ProjectLayout, seed: int
) -> Iterator[SourceMutation]:
    """Distinct mutations in a seeded order that cycles through operators, so common kinds
    (variable swaps) do not crowd out the rare ones."""
    rng = random.Random(f"rollyard-synth:{seed}")
    pools: dict[str, list[tuple[ModuleMutator, int]]] = {op: [] for op in OPERATORS}
    for relative in layout.library_files:
        try:
            mutator = ModuleMutator(relative, (workspace / relative).read_bytes())
        except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError):
            continue
        for index, site in enumerate(mutator.sites):
            pools.setdefault(site.operator, []).append((mutator, index))
    for pool in pools.values():
        rng.shuffle(pool)
    seen: set[tuple[str, int, int, str]] = set()
    operators = [op for op in pools if pools[op]]
    while operators:
        rng.shuffle(operators)
        for operator in list(operators):
            pool = pools[operator]
            while pool:
                mutator, index = pool.pop()
                mutation = mutator.edit(mutator.sites[index])
                if mutation is None:
                    continue
                key = (mutation.path, mutation.start, mutation.end, mutation.replacement)
                if key in seen:
                    continue
                seen.add(key)
                yield mutation
                break
            if not pool:
                operators.remove(operator)


# -- the pipeline -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Baseline:
    """What repeated runs of the original suite agree on."""

    passing: tuple[str, ...]
    """Tests that pass in every run, their ids the same in every run."""
    duration_s: float
    """The slowest run."""
    flaky: tuple[str, ...]
    """Tests that pass in some runs and not in others."""
    varying_ids: tuple[str, ...]
    """Tests whose parametrized ids are not the same set in every run."""


def _unparametrized(test_id: str) -> str:
    return re.sub(r"\[.*\]$", "", test_id, flags=re.DOTALL)


def stable_passing(runs: Sequence[Mapping[str, str]]) -> tuple[list[str], list[str], list[str]]:
    """(passing, flaky, varying) over several runs' outcomes. A test whose parametrized ids
    differ between runs has every id left out: one that happened to match twice may not a
    third time."""
    ids_by_test: list[dict[str, set[str]]] = []
    for outcomes in runs:
        grouped: dict[str, set[str]] = {}
        for test_id in outcomes:
            grouped.setdefault(_unparametrized(test_id), set()).add(test_id)
        ids_by_test.append(grouped)
    tests = sorted(set().union(*ids_by_test))
    varying = [
        test for test in tests if any(g.get(test) != ids_by_test[0].get(test) for g in ids_by_test)
    ]
    varying_set = set(varying)
    passing: list[str] = []
    flaky: list[str] = []
    for test_id in sorted(runs[0]):
        if _unparametrized(test_id) in varying_set:
            continue
        passed = [outcomes.get(test_id) == "passed" for outcomes in runs]
        if all(passed):
            passing.append(test_id)
        elif any(passed):
            flaky.append(test_id)
    return passing, flaky, varying


def _baseline(workspace: Path, layout: ProjectLayout, backend: str, limits: Limits) -> Baseline:
    runs: list[PytestRun] = []
    with open_sandbox(workspace, backend=backend, limits=limits) as sandbox:
        for _ in range(BASELINE_RUNS):
            run = run_pytest(sandbox, layout.test_paths, timeout_s=limits.wall_time_s)
            sandbox.reset()
            if run.broken:
                raise GenerationError(
                    f"the test suite of {layout.name} does not run in the sandbox: {run.broken}"
                )
            runs.append(run)
    passing, flaky, varying = stable_passing([run.outcomes for run in runs])
    if not passing:
        raise GenerationError(
            f"no test of {layout.name} passes on the original code "
            f"({len(runs[0].outcomes)} collected from {', '.join(layout.test_paths)}); "
            "synthesis needs a passing suite (are its test dependencies installed?)"
        )
    return Baseline(
        tuple(passing),
        max(run.executed.duration_s for run in runs),
        tuple(flaky),
        tuple(varying),
    )


def _slug(name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.").lower()
    return (slug or "project")[:60]


def synthesize_tasks(
    project_dir: str | Path,
    out_dir: str | Path,
    *,
    max_tasks: int = 10,
    seed: int = 0,
    max_mutants: int | None = None,
    name: str | None = None,
    executor: Submitter | None = None,
    batch_size: int = 6,
    backend: str = "bwrap",
    limits: Limits | None = None,
    check: bool = True,
    max_fail_to_pass: int | None = None,
    progress: Callable[[MutantResult], None] | None = None,
) -> SynthesisReport:
    """Write up to `max_tasks` bug-fix tasks for the project at `project_dir` under `out_dir`.

    `max_mutants` caps the mutants tried (default 8 per wanted task). With `check`, every kept
    task must pass the oracle check (`tasks_lib.check_task`) or it is dropped. A mutant failing
    more than `max_fail_to_pass` tests is too broad a task; the caller passes the bound its
    curation applies (`CurationSettings.max_fail_to_pass`), None keeps every such mutant. The
    project must be readable by the sandbox workers (with a Dask client: a shared filesystem).
    """
    if max_tasks < 1:
        raise GenerationError(f"max_tasks must be at least 1, got {max_tasks}")
    started = time.monotonic()
    project = Path(project_dir).resolve()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    limits = limits or Limits(wall_time_s=300.0, cpu_time_s=600.0, memory_mb=2048)
    max_mutants = max_mutants or 8 * max_tasks
    staging = Path(tempfile.mkdtemp(prefix=".synthesis-", dir=out))
    try:
        workspace = staging / "workspace"
        hardlinks_left_out = copy_clean(project, workspace, skip=(out,))
        layout = inspect_project(workspace, name or project.name)
        if layout.src_layout:
            add_src_shim(workspace)
        original = _baseline(workspace, layout, backend, limits)
        baseline = original.passing
        checkable = checkable_test_ids(workspace, baseline)
        timeout_s = max(20.0, 3 * original.duration_s + 10)
        mutations = candidate_mutations(workspace, layout, seed)

        def submit(batch: tuple[SourceMutation, ...]) -> Any:
            args = (str(workspace), layout.test_paths, baseline, checkable, batch)
            kwargs = {
                "backend": backend,
                "limits": limits,
                "timeout_s": timeout_s,
                "max_fail_to_pass": max_fail_to_pass,
            }
            if executor is None:
                done: Future[list[MutantResult]] = Future()
                done.set_result(evaluate_mutants(*args, **kwargs))  # type: ignore[arg-type]
                return done
            return executor.submit(evaluate_mutants, *args, **kwargs)

        kept: list[MutantResult] = []
        signatures: set[tuple[tuple[str, str], ...]] = set()
        verdicts: Counter[str] = Counter()
        unstable: list[dict[str, Any]] = []
        tried = 0
        duplicates = 0
        wave = 1 if executor is None else 4
        while len(kept) < max_tasks and tried < max_mutants:
            batches = []
            for _ in range(wave):
                batch: list[SourceMutation] = []
                while len(batch) < batch_size and tried + len(batch) < max_mutants:
                    mutation = next(mutations, None)
                    if mutation is None:
                        break
                    batch.append(mutation)
                if not batch:
                    break
                tried += len(batch)
                batches.append(submit(tuple(batch)))
            if not batches:
                break
            for future in batches:
                for result in future.result():
                    if progress is not None:
                        progress(result)
                    if result.verdict == "unstable":
                        unstable.append(unstable_entry(result))
                    if result.verdict != "kept":
                        verdicts[result.verdict] += 1
                        continue
                    if result.signature in signatures:
                        duplicates += 1
                        verdicts["duplicate"] += 1
                        continue
                    if len(kept) < max_tasks:
                        signatures.add(result.signature)
                        kept.append(result)
                        verdicts["kept"] += 1
                    else:
                        verdicts["over_max"] += 1
        task_dirs: list[str] = []
        check_failures: list[str] = []
        by_operator: Counter[str] = Counter()
        for result in kept:
            task_id = f"{_slug(layout.name)}-{result.mutation.key}"
            path = write_synthesized_task(workspace, layout, result, out / task_id, task_id)
            if check:
                problem = _oracle_problem(path, backend)
                if problem:
                    check_failures.append(f"{task_id}: {problem}")
                    shutil.rmtree(path)
                    continue
            task_dirs.append(str(path))
            by_operator[result.mutation.operator] += 1
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return SynthesisReport(
        project=layout.name,
        mutants_tried=tried,
        tasks_kept=len(task_dirs),
        duplicates=duplicates,
        verdicts=dict(sorted(verdicts.items())),
        kept_by_operator=dict(sorted(by_operator.items())),
        baseline_tests=len(baseline),
        duration_s=time.monotonic() - started,
        task_dirs=tuple(task_dirs),
        check_failures=tuple(check_failures),
        unstable=tuple(unstable),
        flaky_baseline=original.flaky,
        varying_ids=original.varying_ids,
        hardlinks_left_out=hardlinks_left_out,
    )


def _oracle_problem(path: Path, backend: str) -> str:
    try:
        result = check_task(load_task(path))
    except (GenerationError, SandboxError) as error:
        return str(error)
    except Exception as error:  # a task that cannot even load is a failed check, with its reason
        return f"{type(error).__name__}: {error}"
    return "" if result.ok else result.problems[0]
