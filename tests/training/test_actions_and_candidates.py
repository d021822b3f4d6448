"""Action forms round-trip; the candidate proposer reads test output and files the way it should."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from training.actions import (
    EditFile,
    History,
    Observation,
    ReadFile,
    RunCommand,
    Submit,
    action_from_json,
    action_to_json,
    cap_text,
)
from training.candidates import (
    FEATURE_COUNT,
    FEATURE_NAMES,
    find_test_command,
    propose_candidates,
    runnable_test_command,
)

SOURCE = (
    "def clamp(value, low, high):\n    if value > high:\n        return value\n    return value\n"
)
OUTPUT = (
    "    def test_clamp():\n>       assert clamp(9, 0, 5) == 5\nE       assert 9 == 5\n\n"
    "tests/test_calc.py:4: AssertionError\nFAILED tests/test_calc.py::test_clamp - assert 9 == 5\n"
    "1 failed, 1 passed in 0.01s\n"
)

actions = st.one_of(
    st.builds(RunCommand, st.text()),
    st.builds(ReadFile, st.text()),
    st.builds(EditFile, st.text(), st.text(), st.text()),
    st.just(Submit()),
)


@given(actions)
def test_actions_round_trip_through_json(action: object) -> None:
    assert action_from_json(action_to_json(action)) == action  # type: ignore[arg-type]


@given(st.text(), st.integers(40, 400))
def test_cap_text_keeps_within_the_limit(text: str, limit: int) -> None:
    capped, cut = cap_text(text, limit)
    assert len(capped) <= limit and cut == (len(text) > limit)


def _feature(candidate: object, name: str) -> float:
    return candidate.features[FEATURE_NAMES.index(name)]  # type: ignore[attr-defined]


def test_candidates_follow_the_failure_and_include_implausible_edits() -> None:
    history = History("Fix `calc.py`; run `python -m pytest tests`.")
    first = propose_candidates(history)
    assert [c.label for c in first] == ["run tests", "list files", "read calc.py"]
    assert first[0].action == RunCommand(runnable_test_command(history.instruction))
    assert "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1" in first[0].action.command  # type: ignore[union-attr]

    history = history.append(RunCommand("python -m pytest tests"), Observation(OUTPUT, 1))
    history = history.append(ReadFile("calc.py"), Observation(SOURCE, 0))
    candidates = propose_candidates(history)
    assert candidates == propose_candidates(history)  # deterministic
    assert candidates[-1].action == Submit()  # offered once the tests have run
    assert all(len(c.features) == FEATURE_COUNT for c in candidates)
    edits = {c.label: c for c in candidates if c.label.startswith("edit ")}
    fix = edits["edit calc.py:3 wrong_variable 'value'->'high'"]
    assert _feature(fix, "edit_in_failing_function") == 1.0
    kinds = {label.split()[2] for label in edits}
    assert {"comparison", "wrong_variable"} <= kinds
    read_test = next(c for c in candidates if c.label == "read tests/test_calc.py")
    assert _feature(read_test, "read_named_by_failure") == 1.0

    # after an edit: undoing it is offered, and submitting is flagged as untested
    edit = fix.action
    history = history.append(edit, Observation("edited calc.py", 0))
    after = propose_candidates(history)
    revert = next(c for c in after if c.label.startswith("revert"))
    assert isinstance(edit, EditFile)
    assert revert.action == EditFile("calc.py", edit.new_text, edit.old_text)
    assert _feature(after[-1], "submit_untested_edit") == 1.0
    assert _feature(after[0], "run_tests_after_edit") == 1.0


def test_a_change_that_did_not_help_is_replaced_by_the_next_edit() -> None:
    history = History("Fix `calc.py`; run `python -m pytest tests`.")
    history = history.append(RunCommand("python -m pytest tests"), Observation(OUTPUT, 1))
    history = history.append(ReadFile("calc.py"), Observation(SOURCE, 0))
    wrong = next(c.action for c in propose_candidates(history) if "comparison '>'->'>='" in c.label)
    assert isinstance(wrong, EditFile)
    history = history.append(wrong, Observation("edited calc.py", 0))
    history = history.append(RunCommand("python -m pytest tests"), Observation(OUTPUT, 1))
    candidates = propose_candidates(history)
    fix = next(c for c in candidates if "'value'->'high'" in c.label and "calc.py:3" in c.label)
    assert _feature(fix, "edit_replaces_failed_change") == 1.0
    revert = next(c for c in candidates if c.label.startswith("revert"))
    assert _feature(revert, "revert_after_failed_test") == 1.0
    # one edit undoes the failed change and makes the new one
    assert isinstance(fix.action, EditFile)
    changed = SOURCE.replace(wrong.old_text, wrong.new_text, 1)
    fixed = changed.replace(fix.action.old_text, fix.action.new_text, 1)
    assert fixed == SOURCE.replace("return value\n    return", "return high\n    return", 1)


def test_assertion_differences_are_read_into_hints() -> None:
    history = History("Fix `calc.py`; run `python -m pytest tests`.")
    output = OUTPUT.replace("assert 9 == 5", "assert 4 == 5")
    history = history.append(RunCommand("python -m pytest tests"), Observation(output, 1))
    history = history.append(ReadFile("calc.py"), Observation(SOURCE, 0))
    off_by_one = [c for c in propose_candidates(history) if " off_by_one " in c.label]
    assert off_by_one is not None
    assert all(_feature(c, "off_by_one_and_numbers_differ_by_one") == 1.0 for c in off_by_one)


def test_test_command_is_read_from_the_instruction() -> None:
    assert (
        find_test_command("Run it with:\n\n    python -m pytest tests\n")
        == "python -m pytest tests"
    )
    assert find_test_command("run `pytest -q tests/unit`") == "pytest -q tests/unit"
    assert find_test_command("no command here") == "python -m pytest -q"
