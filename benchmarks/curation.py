"""Curation's duplicate and decontamination rules on labelled generated data.

Distinct tasks: demo-family tasks (one family, one template, one pool of modules; tasks whose
generator drew the very same bug set are one task and are set aside) and tasks synthesized from
two small generated repositories (one code base per repository). Planted copies of distinct
tasks, each under a new task id: `new_id` (nothing else changed), `renamed` (every identifier
the project defines, its package and module files renamed, in code, tests, fix and
instruction), `reformatted` (code and tests through another formatter style: 2-space indent,
single quotes, 48-column lines; the fix regenerated), `paraphrased` (instruction reworded with
a synonym table this benchmark owns, paragraphs reordered), `reordered` (test functions and test
id lists reversed) and `all` (every one of those at once).

Scenarios, each judged by `tasks_lib.curate.decide` on the tasks' fingerprints (the oracle
runs, which this change leaves alone, are not part of it):

1. one batch: the distinct tasks and copies of some of them -> copies rejected as duplicates
   naming their original, distinct tasks admitted;
2. two batches: copies of tasks admitted by batch 1 (fingerprints read back from the rows batch 1
   recorded) -> rejected naming the batch-1 task;
3. `instance`: an evaluation set of held-out tasks, the library holding their siblings and copies
   of them -> copies rejected as contaminated, siblings admitted; the same under `off` rejects
   nothing;
4. `repository`: two tasks of repository A held out as the evaluation set -> every other task of
   A rejected, none of repository B.

Targets: 0 false rejections and 100% of the planted copies caught under `instance`; under
`repository` every task of the evaluation repository rejected and none of another.

    python benchmarks/curation.py [--demo-tasks 40] [--synth-tasks 8] [--seed 7] [--originals 6]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from curation_copies import plant
from curation_corpus import ATTEMPTS, REPOSITORIES, Item, distinct_tasks

from sandboxes import SandboxError
from tasks_lib import CandidateChanges, Task, load_task, solution_changes
from tasks_lib.curate import (
    PARTS,
    CurationSettings,
    TaskChecks,
    TaskVerdict,
    decide,
    earlier_admitted,
    load_eval_set,
    task_fingerprint,
    verdict_rows,
)
from tasks_lib.curate.similarity import compare, instruction_templates

DUPLICATE_RULES = frozenset({"exact_duplicate", "near_duplicate"})
EVAL_RULES = frozenset({"contaminated", "eval_repository"})
KINDS = ("new_id", "renamed", "reformatted", "paraphrased", "reordered", "all")

# -- the curation stage ----------------------------------------------------------------------------


@dataclasses.dataclass
class StageTimes:
    """Seconds per task of the fingerprint stage, by step."""

    load_and_solution_s: list[float] = dataclasses.field(default_factory=list)
    """Load the task and run its reference solution in a sandbox (the oracle runs do this
    already: curation pays it once)."""
    fingerprint_s: list[float] = dataclasses.field(default_factory=list)
    """What this stage adds: the fingerprint of every part."""
    decide_s: list[float] = dataclasses.field(default_factory=list)
    """`decide`, per task of the batch."""


def _solution(task: Task) -> CandidateChanges:
    """The reference solution's changes; a sandbox that breaks (a loaded shared host) is tried
    again."""
    for attempt in range(ATTEMPTS):
        try:
            return solution_changes(task)
        except SandboxError as error:
            if attempt == ATTEMPTS - 1:
                raise
            print(f"{task.id}: sandbox error, trying again: {error}", file=sys.stderr)
    raise AssertionError("unreachable")


def fingerprint_stage(
    items: Sequence[Item], settings: CurationSettings, times: StageTimes
) -> list[TaskChecks]:
    """Per task: load, reference solution (one sandbox), fingerprint."""
    checks = []
    for item in items:
        started = time.perf_counter()
        task = load_task(item.task_dir)
        solution = _solution(task)
        solved = time.perf_counter()
        print_ = task_fingerprint(task, solution, settings)
        times.load_and_solution_s.append(solved - started)
        times.fingerprint_s.append(time.perf_counter() - solved)
        checks.append(
            TaskChecks(
                task_dir=str(item.task_dir),
                task_id=task.id,
                task_version=task.version,
                family=task.family,
                source=task.source,
                declared_difficulty=None,
                n_fail_to_pass=len(task.fail_to_pass),
                n_pass_to_pass=len(task.pass_to_pass),
                reasons=(),
                flip_rates={},
                runs=0,
                solution_passes=True,
                fingerprint=print_,
                difficulty=None,
            )
        )
    return checks


@dataclasses.dataclass
class Tally:
    """Flagged tasks of one rule against the labels."""

    rule: str
    scenario: str
    expected: int = 0
    flagged: int = 0
    true_positives: int = 0
    wrong_other: int = 0
    """Flagged copies whose named other task is not of their group."""

    def row(self) -> str:
        precision = self.true_positives / self.flagged if self.flagged else 1.0
        recall = self.true_positives / self.expected if self.expected else 1.0
        return (f"| {self.rule} | {self.scenario} | {self.expected} | {self.flagged} | "
                f"{self.true_positives} | {self.flagged - self.true_positives} | "
                f"{precision:.0%} | {recall:.0%} |")  # fmt: skip


def judge(
    verdicts: Sequence[TaskVerdict],
    items: dict[str, Item],
    rules: frozenset[str],
    positive: Callable[[Item], bool],
    group_of_other: Callable[[str], str | None],
    tally: Tally,
    by_kind: dict[str, list[int]],
    false_rejections: list[str],
) -> None:
    for verdict in verdicts:
        item = items[verdict.task_id]
        hits = [r for r in verdict.reasons if r.rule in rules]
        expected = positive(item)
        tally.expected += expected
        if hits:
            tally.flagged += 1
            right = expected and all(group_of_other(r.other or "") == item.group for r in hits[:1])
            tally.true_positives += right
            tally.wrong_other += expected and not right
        if item.kind is not None and expected:
            by_kind.setdefault(item.kind, [0, 0])
            by_kind[item.kind][0] += 1
            by_kind[item.kind][1] += bool(hits)
        if item.kind is None and not expected and hits:
            false_rejections.append(f"{verdict.task_id}: {hits[0]}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-tasks", type=int, default=40)
    parser.add_argument("--synth-tasks", type=int, default=8, help="per repository")
    parser.add_argument("--originals", type=int, default=6, help="tasks copied per scenario")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep the generated tasks here and reuse them in a later run with the same "
        "arguments (default: a temporary directory, removed at the end)",
    )
    args = parser.parse_args(argv)
    settings = CurationSettings()
    rng = random.Random(args.seed)
    # Task files are read by the unprivileged sandbox user: not under a 0700 temp dir.
    root = args.workdir or Path(tempfile.mkdtemp(prefix="rollyard-curation-bench-", dir="/var/tmp"))
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    for scratch in [p for p in root.iterdir() if p.name != "corpus"]:
        shutil.rmtree(scratch)  # copies and evaluation sets of an earlier run
    try:
        started = time.perf_counter()
        distinct, same_bugs = distinct_tasks(root, args.demo_tasks, args.synth_tasks, args.seed)
        generation_s = time.perf_counter() - started
        by_origin: dict[str, list[Item]] = {}
        for item in distinct:
            by_origin.setdefault(item.origin, []).append(item)
        print(f"distinct tasks: {len(distinct)} ({', '.join(f'{k} {len(v)}' for k, v in by_origin.items())}); "
              f"demo tasks set aside as the same bug set again: {same_bugs}; generated in {generation_s:.0f} s")  # fmt: skip

        def sample(count: int, exclude: Iterable[Item] = ()) -> list[Item]:
            skip = {i.task_id for i in exclude}
            picked: list[Item] = []
            for origin in by_origin.values():  # every origin copied, round robin
                pool = [i for i in origin if i.task_id not in skip]
                picked += rng.sample(pool, min(len(pool), max(1, count // len(by_origin))))
            return picked[:count] if len(picked) >= count else picked

        eval_root = root / "eval"
        eval_root.mkdir()

        # Fingerprints of every distinct task once; copies per scenario.
        times = StageTimes()
        distinct_checks = fingerprint_stage(distinct, settings, times)
        checks_of = {c.task_id: c for c in distinct_checks}
        items = {i.task_id: i for i in distinct}

        tallies: list[Tally] = []
        by_kind: dict[str, dict[str, list[int]]] = {}
        false_rejections: list[str] = []

        def group_of(task_id: str) -> str | None:
            base = task_id.split(" ")[0]
            return items[base].group if base in items else None

        def timed_decide(checks: Sequence[TaskChecks], **kwargs: Any) -> list[TaskVerdict]:
            begun = time.perf_counter()
            verdicts = decide(checks, settings, **kwargs)
            times.decide_s.append((time.perf_counter() - begun) / max(1, len(checks)))
            return verdicts

        def copies_of(originals: Sequence[Item], where: Path) -> list[TaskChecks]:
            where.mkdir()
            planted = [plant(o, kind, where, args.seed) for o in originals for kind in KINDS]
            checks = fingerprint_stage(planted, settings, times)
            items.update({p.task_id: p for p in planted})
            return checks

        # 1. One batch: distinct tasks and copies of some of them.
        originals = sample(args.originals)
        planted = copies_of(originals, root / "copies-1")
        tally = Tally("exact_duplicate + near_duplicate", "1. one batch")
        judge(timed_decide([*distinct_checks, *planted]), items, DUPLICATE_RULES,
              lambda i: i.kind is not None, group_of, tally, by_kind.setdefault("1. one batch", {}),
              false_rejections)  # fmt: skip
        tallies.append(tally)

        # 2. Two batches: batch 1 admitted and recorded; batch 2 holds the rest and copies of
        # batch-1 tasks, compared with the fingerprints batch 1's rows carry.
        first, second = distinct_checks[::2], distinct_checks[1::2]
        first_ids = {c.task_id for c in first}
        rows = verdict_rows(timed_decide(first))
        for row in rows:
            row["batch_id"] = "batch-1"
        earlier, unreadable = earlier_admitted(json.loads(json.dumps(rows)))  # as stored
        assert not unreadable and len(earlier) == len(first), (unreadable, len(earlier))
        originals2 = [items[c.task_id] for c in first][: args.originals]
        planted2 = copies_of(originals2, root / "copies-2")
        tally = Tally("exact_duplicate + near_duplicate", "2. against batch 1")
        judge(timed_decide([*second, *planted2], earlier=earlier), items, DUPLICATE_RULES,
              lambda i: i.kind is not None and i.group in {items[t].group for t in first_ids},
              group_of, tally, by_kind.setdefault("2. against batch 1", {}), false_rejections)  # fmt: skip
        tallies.append(tally)

        # 3. Evaluation set of held-out tasks; the library holds their siblings and copies.
        held_out = sample(args.originals, exclude=originals)
        for item in held_out:
            shutil.copytree(item.task_dir, eval_root / item.task_id)
        eval_set = load_eval_set(sorted(eval_root.iterdir()), settings)
        held_ids = {i.task_id for i in held_out}
        library = [checks_of[i.task_id] for i in distinct if i.task_id not in held_ids]
        planted3 = copies_of(held_out, root / "copies-3")
        for policy in ("instance", "off"):
            tally = Tally("contaminated", f"3. evaluation set, {policy}")
            verdicts = timed_decide(
                [*library, *planted3], eval_set=eval_set, decontamination=policy
            )
            assert all(v.decontamination == policy for v in verdicts)
            judge(verdicts, items, EVAL_RULES,
                  (lambda i: i.kind is not None) if policy == "instance" else (lambda i: False),
                  group_of, tally, by_kind.setdefault(f"3. evaluation set, {policy}", {}),
                  false_rejections)  # fmt: skip
            tallies.append(tally)

        # 4. Repository policy: two tasks of the first repository held out.
        repo_a, repo_b = list(REPOSITORIES)
        held_a = by_origin[repo_a][:2]
        repo_eval = root / "eval-repository"
        repo_eval.mkdir()
        for item in held_a:
            shutil.copytree(item.task_dir, repo_eval / item.task_id)
        repo_set = load_eval_set(sorted(repo_eval.iterdir()), settings)
        held_a_ids = {i.task_id for i in held_a}
        synthesized = [checks_of[i.task_id] for i in [*by_origin[repo_a], *by_origin[repo_b]]
                       if i.task_id not in held_a_ids]  # fmt: skip
        for policy in ("repository", "instance"):
            tally = Tally("eval_repository" if policy == "repository" else "contaminated",
                          f"4. repository {repo_a} in eval, {policy}")  # fmt: skip
            verdicts = timed_decide(synthesized, eval_set=repo_set, decontamination=policy)
            rules = frozenset({"eval_repository"}) if policy == "repository" else EVAL_RULES
            judge(verdicts, items, rules,
                  (lambda i: i.origin == repo_a) if policy == "repository" else (lambda i: False),
                  lambda other: items[other].group if other in items else None,
                  tally, {}, false_rejections)  # fmt: skip
            if policy == "repository":
                # Evidence names an evaluation task of the same repository.
                tally.true_positives = sum(
                    1 for v in verdicts
                    if items[v.task_id].origin == repo_a
                    and any(r.rule == "eval_repository" and r.other in held_a_ids for r in v.reasons)
                )  # fmt: skip
            tallies.append(tally)

        # Margins: the most similar distinct pair against the least similar copy, per part.
        prints = [c.fingerprint for c in distinct_checks if c.fingerprint]
        template = instruction_templates(prints, settings)
        highest = {p: 0.0 for p in PARTS}
        for i, left in enumerate(prints):
            for right in prints[i + 1 :]:
                match = compare(left, right, template, settings)
                for part, value in match.similarity.items():
                    highest[part] = max(highest[part], value)
        lowest: dict[str, dict[str, float]] = {}
        for check in planted:
            item = items[check.task_id]
            original = checks_of[item.task_id.split("-copy-")[0]]
            assert check.fingerprint and original.fingerprint
            match = compare(check.fingerprint, original.fingerprint, template, settings)
            row = lowest.setdefault(item.kind or "", {})
            for part, value in match.similarity.items():
                row[part] = min(row.get(part, 1.0), value)

        figures = {
            "distinct_tasks": {k: len(v) for k, v in by_origin.items()},
            "demo_same_bug_set_set_aside": same_bugs,
            "tallies": [dataclasses.asdict(t) for t in tallies],
            "recall_by_kind": by_kind,
            "false_rejections": false_rejections,
            "ms_per_task": {
                step: {
                    "median": round(1000 * statistics.median(values), 2),
                    "p95": round(1000 * sorted(values)[int(0.95 * (len(values) - 1))], 2),
                }
                for step, values in dataclasses.asdict(times).items()
            },
            "highest_distinct_similarity": {k: round(v, 3) for k, v in highest.items()},
            "lowest_copy_similarity": {
                k: {p: round(v, 3) for p, v in row.items()} for k, row in lowest.items()
            },
        }
        print()
        print("| rule | scenario | expected | flagged | right | wrong | precision | recall |")
        print("|---|---|---|---|---|---|---|---|")
        for tally in tallies:
            print(tally.row())
        print()
        print("| scenario | " + " | ".join(KINDS) + " |")
        print("|---|" + "---|" * len(KINDS))
        for scenario, kinds in by_kind.items():
            if kinds:
                cells = [f"{kinds[k][1]}/{kinds[k][0]}" if k in kinds else "-" for k in KINDS]
                print(f"| {scenario} | " + " | ".join(cells) + " |")
        print()
        print(
            "| part | most similar distinct pair | "
            + " | ".join(f"least similar copy: {k}" for k in KINDS)
            + " |"
        )
        print("|---|---|" + "---|" * len(KINDS))
        for part in PARTS:
            cells = [f"{lowest[k][part]:.2f}" if part in lowest.get(k, {}) else "-" for k in KINDS]
            print(f"| {part} | {highest[part]:.2f} | " + " | ".join(cells) + " |")
        print()
        print(f"false rejections of distinct tasks: {len(false_rejections)}")
        for line in false_rejections[:10]:
            print(f"  {line}")
        print()
        labels = {
            "load_and_solution_s": "load the task, run its reference solution in a sandbox",
            "fingerprint_s": "fingerprint every part",
            "decide_s": "decide (duplicates, decontamination), per task of the batch",
        }
        print("| step, per task | median ms | p95 ms |")
        print("|---|---|---|")
        for step, value in figures["ms_per_task"].items():
            print(f"| {labels[step]} | {value['median']} | {value['p95']} |")
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2, sort_keys=True))
        instance_ok = not false_rejections and all(
            t.true_positives == t.expected and t.flagged == t.true_positives for t in tallies
        )
        print(f"targets: {'PASS' if instance_ok else 'FAIL'}")
        return 0 if instance_ok else 1
    finally:
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
