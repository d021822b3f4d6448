"""The built-in policy's proposers for data-analysis and troubleshooting tasks: they route by the
instruction, propose bounded and deterministic candidate sets that hold sensible actions, fill
their own block of the one feature space, and drive real episodes in bwrap sandboxes."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from sandboxes import open_sandbox
from tasks_lib import load_task
from tasks_lib.format.model import Task
from tasks_lib.sources.families.data_analysis.generate import plan_data_task, write_data_task
from tasks_lib.sources.families.ops.generate import plan_ops_task, write_ops_task
from training.actions import (
    TRIAL_KEPT,
    History,
    Observation,
    ReadFile,
    RunCommand,
    Submit,
    TryEdit,
)
from training.builtin.features import (
    DATA_FEATURE_NAMES,
    FAMILY_FEATURE_NAMES,
    FEATURE_COUNT,
    FEATURE_NAMES,
    OPS_FEATURE_NAMES,
    Candidate,
)
from training.builtin.proposers import (
    data_analysis,
    family_proposer_for,
    ops,
    propose_candidates,
)
from training.builtin.scorer_policy import CandidateScorerPolicy
from training.episode import EpisodeConfig, run_episode
from training.policy import Decision, Policy
from training.trajectory import EpisodeKey

PROFILE = "\n".join(
    [
        "rows 80",
        "column\torder_id\tBIGINT\t80\t1002\t998034\t",
        "column\torder_date\tDATE\t75\t2022-01-03\t2023-12-28\t",
        "column\tregion\tVARCHAR\t5\tcentral\twest\tcentral|east|north|south|west",
        "column\tproduct\tVARCHAR\t6\tanvil\tjack\tanvil|bolt|cable|drill|ink|jack",
        "column\tquantity\tBIGINT\t20\t1\t20\t",
        "column\tunit_price\tDOUBLE\t80\t1.5\t249.0\t",
        "column\tstatus\tVARCHAR\t4\tcancelled\tshipped\tcancelled|delivered|returned|shipped",
        "[exit code 0]",
    ]
)
STUB = 'raise NotImplementedError("write the analysis")\n'
QUESTION_OF_INDEX = {"revenue_by_region": 0, "monthly_orders": 2, "median_order_value": 4}
"""Seed-0 task indices of the data-analysis questions; index 7 is `top_products`."""
QUESTION_OF_INDEX["top_products"] = 7


def _data_task(root: Path, index: int) -> Task:
    return load_task(write_data_task(plan_data_task(0, index), root / f"data-{index}"))


def _ops_task(root: Path, index: int) -> Task:
    return load_task(write_ops_task(plan_ops_task(0, index), root / f"ops-{index}"))


def _feature(candidate: Candidate, name: str) -> float:
    return candidate.features[FEATURE_NAMES.index(name)]


def _profiled(task: Task) -> History:
    """The history after profiling the data and reading the script."""
    spec = data_analysis.read_spec(task.instruction)
    assert spec is not None
    history = History(task.instruction)
    history = history.append(
        RunCommand(data_analysis.profile_command(spec)), Observation(PROFILE, 0)
    )
    return history.append(ReadFile(spec.script), Observation(STUB, 0))


def _workspace_file(task: Task, path: str) -> str:
    return (task.snapshot_dir / path).read_text()


# -- the feature space and routing ------------------------------------------------------------


def test_family_features_are_one_block_at_the_end_of_the_feature_space() -> None:
    assert FEATURE_NAMES[-len(FAMILY_FEATURE_NAMES) :] == FAMILY_FEATURE_NAMES
    assert (*DATA_FEATURE_NAMES, *OPS_FEATURE_NAMES) == FAMILY_FEATURE_NAMES
    assert len(set(FEATURE_NAMES)) == FEATURE_COUNT


def test_instructions_route_to_their_proposer(tmp_path: Path, bug_task: Task) -> None:
    data, service = _data_task(tmp_path, 0), _ops_task(tmp_path, 0)
    assert family_proposer_for(History(data.instruction)) is data_analysis.propose
    assert family_proposer_for(History(service.instruction)) is ops.propose
    assert family_proposer_for(History(bug_task.instruction)) is None
    # a bug-fix task still gets the bug-fix proposer's first moves
    labels = [c.label for c in propose_candidates(History(bug_task.instruction))]
    assert "run tests" in labels


# -- data analysis ----------------------------------------------------------------------------


def test_the_answer_spec_is_read_from_each_question(tmp_path: Path) -> None:
    shapes = {
        "revenue_by_region": ("table", ("region", "revenue"), "answer.csv"),
        "monthly_orders": ("table", ("month", "orders"), "answer.csv"),
        "median_order_value": ("scalar", (), "answer.json"),
        "top_products": ("list", (), "answer.json"),
    }
    for question, index in QUESTION_OF_INDEX.items():
        spec = data_analysis.read_spec(_data_task(tmp_path, index).instruction)
        assert spec is not None
        assert (spec.shape, spec.columns, spec.output) == shapes[question], question
        assert spec.script == "analysis.py" and spec.run_command == "python analysis.py"


def test_data_candidates_start_with_looking_and_hold_the_sensible_script(tmp_path: Path) -> None:
    task = _data_task(tmp_path, QUESTION_OF_INDEX["revenue_by_region"])
    first = propose_candidates(History(task.instruction))
    assert [type(c.action) for c in first] == [RunCommand, ReadFile]
    candidates = propose_candidates(_profiled(task))
    scripts = [c for c in candidates if isinstance(c.action, TryEdit)]
    assert 4 <= len(scripts) <= 40
    assert not any(isinstance(c.action, Submit) for c in candidates)  # nothing tried yet
    labels = {c.label: c for c in scripts}
    sensible = labels["try sum(quantity*unit_price) by region where \"status\" <> 'cancelled'"]
    for name in (
        "data_agg_cued",
        "data_measure_product_stated",
        "data_filter_covers_quoted",
        "data_filter_agrees_with_negation",
        "data_group_is_output_key",
    ):
        assert _feature(sensible, name) == 1.0, name
    contrary = labels["try sum(quantity*unit_price) by region where \"status\" = 'cancelled'"]
    assert _feature(contrary, "data_filter_contradicts_negation") == 1.0
    assert _feature(labels["try count(*) by region"], "data_measure_none") == 1.0
    action = sensible.action
    assert isinstance(action, TryEdit) and action.old_text == STUB and action.failing_before == 1
    assert "GROUP BY 1" in action.new_text and "answer.csv" in action.new_text
    assert action.test_command.startswith("python analysis.py && ")


def test_every_question_kind_gets_a_bounded_grammar(tmp_path: Path) -> None:
    expected = {
        "revenue_by_region": "sum(quantity*unit_price) by region where \"status\" <> 'cancelled'",
        "monthly_orders": 'count(*) by month where "region" = \'',
        "median_order_value": 'median(quantity*unit_price) where "status" = \'',
        "top_products": "sum(quantity) by product where \"status\" <> 'cancelled' AND year(",
    }
    for question, index in QUESTION_OF_INDEX.items():
        candidates = propose_candidates(_profiled(_data_task(tmp_path, index)))
        labels = [c.label for c in candidates]
        assert len(candidates) <= 40, question
        assert any(label.startswith(f"try {expected[question]}") for label in labels), question


def test_a_script_that_wrote_an_answer_leaves_only_submit(tmp_path: Path) -> None:
    task = _data_task(tmp_path, QUESTION_OF_INDEX["median_order_value"])
    history = _profiled(task)
    scripts = [c for c in propose_candidates(history) if isinstance(c.action, TryEdit)]
    failed = history.append(scripts[0].action, Observation("Error\n[edit reverted: ?]", 1))
    again = {c.label: c for c in propose_candidates(failed)}
    assert scripts[0].label not in again  # a failed script would fail again
    assert "submit" in again
    kept = failed.append(scripts[1].action, Observation(f"1 passed\n{TRIAL_KEPT}: 1 -> 0]", 0))
    assert [c.label for c in propose_candidates(kept)] == ["submit"]


# -- operations ---------------------------------------------------------------------------------


def test_the_check_runs_the_instructions_criteria(tmp_path: Path) -> None:
    task = _ops_task(tmp_path, 0)
    criteria = ops.read_criteria(task.instruction)
    assert [c.kind for c in criteria] == ["command", "service", "command"]
    service = criteria[1]
    assert (service.run, service.host, service.paths, service.status) == (
        "sh run.sh",
        "127.0.0.1",
        ("/health",),
        200,
    )
    assert criteria[2].writes == "out/report.csv"
    first = propose_candidates(History(task.instruction))
    assert first[0].label == "run the check"
    assert not any(isinstance(c.action, TryEdit | Submit) for c in first)


def _after_check(task: Task, output: str, *reads: str) -> History:
    history = History(task.instruction).append(
        RunCommand(ops.check_command(ops.read_criteria(task.instruction))), Observation(output, 1)
    )
    for path in reads:
        history = history.append(ReadFile(path), Observation(_workspace_file(task, path), 0))
    return history


KEY_ERROR = """FAIL 2: sh run.sh serves: the service exited with 1 before answering
Traceback (most recent call last):
  File "/workspace/app/server.py", line 20, in <module>
    NAMES = warm_cache()
  File "/workspace/app/server.py", line 17, in warm_cache
    return {row["sku"]: row["product_name"] for row in csv.DictReader(handle)}
KeyError: 'product_name'
giving up: the server keeps crashing
1 failed, 2 passed
[exit code 1]"""


def test_a_missing_key_proposes_renames_to_the_data_columns(tmp_path: Path) -> None:
    task = _ops_task(tmp_path, 3)  # crash_loop
    history = _after_check(task, KEY_ERROR)
    reads = {c.label: c for c in propose_candidates(history) if isinstance(c.action, ReadFile)}
    assert _feature(reads["read app/server.py"], "ops_read_in_traceback") == 1.0
    history = _after_check(task, KEY_ERROR, "app/server.py", "data/items.csv")
    candidates = propose_candidates(history)
    renames = [c for c in candidates if "rename_in_code" in c.label]
    assert {c.label.rsplit("->", 1)[1] for c in renames} == {"sku", "name", "price", "stock"}
    to_name = next(c for c in renames if c.label.endswith("->name"))
    for feature in (
        "ops_edit_in_traceback_file",
        "ops_edit_line_in_traceback",
        "ops_rename_name_not_in_data",
        "ops_rename_to_data_column",
        "ops_rename_shares_word",
        "ops_rename_in_code_given_missing_key",
        "ops_evidence_missing_key",
    ):
        assert _feature(to_name, feature) == 1.0, feature
    action = to_name.action
    assert isinstance(action, TryEdit) and action.failing_before == 1
    assert 'row["name"]' in action.new_text and 'row["product_name"]' in action.old_text


def test_configuration_edits_cover_addresses_modes_and_numbers(tmp_path: Path) -> None:
    task = _ops_task(tmp_path, 0)  # bad_config
    output = "FAIL 2: sh run.sh serves\nsocket.gaierror: [Errno -2] Name or service not known\n"
    history = _after_check(task, output + "1 failed, 2 passed\n", "config/app.toml")
    candidates = propose_candidates(history)
    edits = {c.label.split(" ", 2)[2]: c for c in candidates if isinstance(c.action, TryEdit)}
    drop = edits["config_address host: drop the port"]
    assert _feature(drop, "ops_address_drops_port") == 1.0
    assert _feature(drop, "ops_config_address_given_address_error") == 1.0
    assert re.search(r'host = "127\.0\.0\.1"$', drop.action.new_text)  # type: ignore[union-attr]
    assert _feature(edits["config_mode db_mode: 0644->0444"], "ops_mode_owner_writable") == 0.0
    assert _feature(edits["config_mode db_mode: 0644->0664"], "ops_mode_owner_writable") == 1.0
    assert any(label.startswith("config_number port:") for label in edits)
    assert len(candidates) <= 40


# -- all proposers ------------------------------------------------------------------------------


def _histories(tmp_path: Path) -> list[History]:
    data = _data_task(tmp_path, QUESTION_OF_INDEX["top_products"])
    crash = _ops_task(tmp_path, 3)
    return [
        History(data.instruction),
        _profiled(data),
        History(crash.instruction),
        _after_check(crash, KEY_ERROR, "app/server.py", "data/items.csv"),
    ]


def test_proposals_are_deterministic_and_fill_only_their_own_block(tmp_path: Path) -> None:
    data_block = {FEATURE_NAMES.index(n) for n in DATA_FEATURE_NAMES}
    ops_block = {FEATURE_NAMES.index(n) for n in OPS_FEATURE_NAMES}
    for history in _histories(tmp_path):
        candidates = propose_candidates(history)
        assert candidates == propose_candidates(history)
        assert len({c.action for c in candidates}) == len(candidates)
        block = data_block if data_analysis.applies(history.instruction) else ops_block
        for candidate in candidates:
            assert len(candidate.features) == FEATURE_COUNT
            active = {i for i, value in enumerate(candidate.features) if value}
            assert active <= block, candidate.label


def test_the_untrained_policy_chooses_uniformly(tmp_path: Path) -> None:
    policy = CandidateScorerPolicy()
    for history in _histories(tmp_path):
        candidates = propose_candidates(history)
        features = torch.tensor([c.features for c in candidates], dtype=torch.float32)
        with torch.no_grad():
            log_probs = torch.log_softmax(policy.network(features), dim=-1)
        assert torch.allclose(log_probs, torch.full_like(log_probs, -math.log(len(candidates))))
        decision = policy.choose(candidates)
        assert decision.logprob == pytest.approx(-math.log(len(candidates)))


# -- real episodes --------------------------------------------------------------------------------


class _PickByLabel(Policy):
    """Takes the first candidate whose label matches one of `patterns` in turn, else submits."""

    def __init__(self, *patterns: str) -> None:
        self.patterns = patterns

    @property
    def version(self) -> str:
        return "pick-by-label"

    def act(self, history: History) -> Decision:
        candidates = propose_candidates(history)
        for pattern in self.patterns:
            for candidate in candidates:
                if re.search(pattern, candidate.label):
                    return Decision((candidate.action,))
        return Decision((Submit(),))


def test_the_policy_runs_episodes_on_both_families_in_bwrap(tmp_path: Path) -> None:
    tasks = [_data_task(tmp_path, QUESTION_OF_INDEX["monthly_orders"]), _ops_task(tmp_path, 2)]
    policy = CandidateScorerPolicy(seed=3)
    for task in tasks:
        with open_sandbox(task.snapshot_dir, limits=task.limits) as sandbox:
            trajectory = run_episode(
                task, policy, sandbox, key=EpisodeKey("domains", 0),
                config=EpisodeConfig(max_steps=6),
            )  # fmt: skip
        assert trajectory.status.value == "ok", trajectory.error
        assert trajectory.reward in (0.0, 1.0) and trajectory.steps
        history = History(task.instruction)
        for step in trajectory.steps:
            assert step.action in {c.action for c in propose_candidates(history)}
            assert step.record is not None and step.logprob is not None
            history = history.append(step.action, step.observation)


def test_the_sensible_candidates_solve_one_task_of_each_family(tmp_path: Path) -> None:
    cases = [
        (
            _data_task(tmp_path, QUESTION_OF_INDEX["median_order_value"]),  # Parquet data
            _PickByLabel(
                "^profile", "^read", r"^try median\(quantity\*unit_price\) where \"status\" = '"
            ),
        ),
        (
            _ops_task(tmp_path, 1),  # permissions
            _PickByLabel(
                "^run the check",
                "^read config/app.toml",
                "^list files",
                r"db_mode: 0444->0644$",
            ),
        ),
    ]
    for task, policy in cases:
        with open_sandbox(task.snapshot_dir, limits=task.limits) as sandbox:
            trajectory = run_episode(
                task, policy, sandbox, key=EpisodeKey("domains", 1),
                config=EpisodeConfig(max_steps=6),
            )  # fmt: skip
        kinds = [type(step.action).__name__ for step in trajectory.steps]
        assert trajectory.reward == 1.0, (kinds, trajectory.error, trajectory.steps[-2:])
        assert kinds[-2:] == ["TryEdit", "Submit"]
        assert TRIAL_KEPT in trajectory.steps[-2].observation.text
