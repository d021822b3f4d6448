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
from training.candidates import FEATURE_COUNT, FEATURE_NAMES, find_test_command, propose_candidates

SOURCE = (
    "def clamp(value, low, high):\n    if value > high:\n        return value\n    return value\n"
)
OUTPUT = (
    "    def test_clamp():\n>       assert clamp(9, 0, 5) == 5\nE       assert 9 == 5\n\n"
    "tests/test_calc.py:4: AssertionError\nFAILED tests/test_calc.py::test_clamp - assert 9 == 5\n"
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
    assert [c.label for c in first[:3]] == ["run tests", "list files", "read calc.py"]
    assert first[0].action == RunCommand("python -m pytest tests") and first[-1].action == Submit()

    history = history.append(RunCommand("python -m pytest tests"), Observation(OUTPUT, 1))
    history = history.append(ReadFile("calc.py"), Observation(SOURCE, 0))
    candidates = propose_candidates(history)
    assert candidates == propose_candidates(history)  # deterministic
    assert all(len(c.features) == FEATURE_COUNT for c in candidates)
    edits = {c.label.split(" ", 2)[2]: c for c in candidates if c.label.startswith("edit ")}
    fix = next(
        c for label, c in edits.items() if "'value'->'high'" in label and "calc.py:3" in c.label
    )
    assert _feature(fix, "edit_in_failing_function") == 1.0
    kinds = {label.split()[0] for label in edits}
    assert {"comparison", "wrong_variable", "delete_line"} <= kinds
    read_test = next(c for c in candidates if c.label == "read tests/test_calc.py")
    assert _feature(read_test, "read_named_by_failure") == 1.0

    # after an edit: a revert is offered, and submitting is flagged as untested
    edit = fix.action
    history = history.append(edit, Observation("edited calc.py", 0))
    after = propose_candidates(history)
    revert = next(c for c in after if c.label.startswith("revert"))
    assert isinstance(edit, EditFile)
    assert revert.action == EditFile("calc.py", edit.new_text, edit.old_text)
    assert _feature(after[-1], "submit_untested_edit") == 1.0
    assert _feature(after[0], "run_tests_after_edit") == 1.0


def test_test_command_is_read_from_the_instruction() -> None:
    assert (
        find_test_command("Run it with:\n\n    python -m pytest tests\n")
        == "python -m pytest tests"
    )
    assert find_test_command("run `pytest -q tests/unit`") == "pytest -q tests/unit"
    assert find_test_command("no command here") == "python -m pytest -q"
