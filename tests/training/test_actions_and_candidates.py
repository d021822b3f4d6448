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
    TryEdit,
    action_from_json,
    action_to_json,
    cap_text,
    failing_test_count,
)
from training.builtin.bugfix import find_test_command, runnable_test_command
from training.builtin.features import FEATURE_COUNT, FEATURE_NAMES
from training.builtin.proposers import propose_candidates

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
    st.builds(TryEdit, st.text(), st.text(), st.text(), st.text(), st.integers(0, 99)),
    st.just(Submit()),
)


@given(actions)
def test_actions_round_trip_through_json(action: object) -> None:
    assert action_from_json(action_to_json(action)) == action  # type: ignore[arg-type]


@given(st.text(), st.integers(40, 400))
def test_cap_text_keeps_within_the_limit(text: str, limit: int) -> None:
    capped, cut = cap_text(text, limit)
    assert len(capped.encode()) <= limit and cut == (len(text.encode()) > limit)


def _feature(candidate: object, name: str) -> float:
    return candidate.features[FEATURE_NAMES.index(name)]  # type: ignore[attr-defined]


INSTRUCTION = "Fix `calc.py`; `tests/test_calc.py::test_clamp` fails. Run `python -m pytest tests`."


def test_candidates_follow_the_failure() -> None:
    history = History(INSTRUCTION)
    first = propose_candidates(history)
    assert [c.label for c in first] == ["run tests", "read calc.py"]  # tests are never read
    assert first[0].action == RunCommand(runnable_test_command(history.instruction))
    assert "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1" in first[0].action.command  # type: ignore[union-attr]

    history = history.append(RunCommand("python -m pytest tests"), Observation(OUTPUT, 1))
    history = history.append(ReadFile("calc.py"), Observation(SOURCE, 0))
    candidates = propose_candidates(history)
    assert candidates == propose_candidates(history)  # deterministic
    assert candidates[-1].action == Submit()  # offered once the tests have run
    assert all(len(c.features) == FEATURE_COUNT for c in candidates)
    assert not any(c.label in ("run tests", "read calc.py") for c in candidates)  # done already
    trials = {c.label: c for c in candidates if c.label.startswith("try ")}
    fix = trials["try calc.py:3 wrong_variable 'value'->'low'"]
    assert _feature(fix, "edit_in_failing_function") == 1.0
    assert _feature(fix, "wrong_variable_given_numbers_further_apart") == 1.0
    assert isinstance(fix.action, TryEdit)
    assert fix.action.failing_before == 1  # what the run reported
    assert fix.action.test_command == runnable_test_command(INSTRUCTION)
    kinds = {label.split()[2] for label in trials}
    assert {"comparison", "wrong_variable"} <= kinds


def test_a_reverted_trial_is_marked_tried_and_a_kept_one_moves_the_baseline() -> None:
    history = History(INSTRUCTION).append(ReadFile("calc.py"), Observation(SOURCE, 0))
    candidates = propose_candidates(history)
    wrong = next(c for c in candidates if "comparison '>'->'>='" in c.label)
    assert isinstance(wrong.action, TryEdit)
    assert wrong.action.failing_before == 1  # from the instruction's list of failing tests
    reverted = Observation(OUTPUT + "[edit reverted: 1 failing tests, not fewer than 1]", 1)
    history = history.append(wrong.action, reverted)
    after = {c.label: c for c in propose_candidates(history)}
    assert wrong.label not in after  # the same content would fail the same way again
    same_line = next(c for c in after.values() if "comparison '>'->'<'" in c.label)
    assert _feature(same_line, "edit_line_tried_before") == 1.0
    assert _feature(same_line, "trials_reverted_scaled") > 0.0

    fix = after["try calc.py:3 wrong_variable 'value'->'low'"]
    kept = Observation("2 passed in 0.01s\n[edit kept: 1 -> 0 failing tests]", 0)
    history = history.append(fix.action, kept)
    assert [c.label for c in propose_candidates(history)] == ["submit"]  # nothing left to try


def test_assertion_differences_are_read_into_evidence() -> None:
    history = History(INSTRUCTION)
    output = OUTPUT.replace("assert 9 == 5", "assert 4 == 5")
    history = history.append(RunCommand("python -m pytest tests"), Observation(output, 1))
    history = history.append(ReadFile("calc.py"), Observation(SOURCE, 0))
    trials = [c for c in propose_candidates(history) if c.label.startswith("try ")]
    flips = [c for c in trials if " comparison " in c.label]
    assert flips
    assert all(_feature(c, "comparison_given_numbers_one_apart") == 1.0 for c in flips)
    assert all(_feature(c, "comparison_given_no_evidence") == 0.0 for c in flips)
    assert all(_feature(c, "off_by_one_given_numbers_one_apart") == 0.0 for c in flips)


def test_inverse_slips_restore_lost_calls_and_unread_variables() -> None:
    source = (
        "def box(xs, ys):\n"
        '    """Bounds."""\n'
        "    return (min(xs), ys, max(xs), max(ys))\n"
        "\n"
        "\n"
        "def mean(total, count):\n"
        "    return total / total\n"
    )
    history = History(
        "Fix `geo.py`: `tests/test_geo.py::test_box_1` and `tests/test_geo.py::test_mean_1` fail."
    )
    history = history.append(ReadFile("geo.py"), Observation(source, 0))
    labels = {c.label for c in propose_candidates(history)}
    assert "try geo.py:3 missing_call add min(...)" in labels
    assert "try geo.py:7 wrong_variable 'total'->'count'" in labels  # count is never read
    assert not any("docstring" in label or ":2 " in label for label in labels)


def test_failing_test_count_reads_pytest_summaries() -> None:
    assert failing_test_count("1 failed, 2 passed in 0.1s", 1) == 1
    assert failing_test_count("2 failed, 1 error in 0.1s", 1) == 3
    assert failing_test_count("3 passed in 0.1s", 0) == 0
    assert failing_test_count("Interrupted: 1 error during collection", 2) is None
    assert failing_test_count("sh: pytest: not found", 127) is None


def test_test_command_is_read_from_the_instruction() -> None:
    assert (
        find_test_command("Run it with:\n\n    python -m pytest tests\n")
        == "python -m pytest tests"
    )
    assert find_test_command("run `pytest -q tests/unit`") == "pytest -q tests/unit"
    assert find_test_command("no command here") == "python -m pytest -q"
    # backticks around other things must not pair up into a "command" (the demo's instruction)
    demo = (
        "(`pkg/a.py`, `pkg/b.py`) with a pytest suite in `tests/`.\n\n    python -m pytest tests\n"
    )
    assert find_test_command(demo) == "python -m pytest tests"


def test_the_edit_digest_follows_reads_kept_edits_and_reverted_trials() -> None:
    from training.actions import TRIAL_KEPT, TRIAL_REVERTED
    from training.builtin.bugfix import _read_situation
    from training.builtin.edit_history import digest, follow_edits
    from training.builtin.proposers.base import follow_edits as proposers_follow_edits

    source = "def f(x):\n    return x < 1\n"
    test = "python -m pytest -q"
    turns = [
        (ReadFile("/workspace/./pkg/a.py"), Observation(source, 0)),
        # a failed edit (the path was refused) leaves the file as it was
        (EditFile("pkg/a.py", "x < 1", "x > 1"), Observation("refused", 1)),
        (TryEdit("pkg/a.py", "x < 1", "x <= 1", test, 1), Observation(f"{TRIAL_REVERTED}]", 1)),
        (TryEdit("pkg/a.py", "return x", "return -x", test, 1), Observation(f"{TRIAL_KEPT}]", 0)),
        # a trial on a file never read counts, but changes nothing known
        (TryEdit("pkg/b.py", "y", "z", test, 1), Observation(f"{TRIAL_REVERTED}]", 1)),
    ]
    history = History("fix pkg/a.py")
    for action, observation in turns:
        history = history.append(action, observation)
    edits = follow_edits(history)
    assert proposers_follow_edits is follow_edits  # one digest for every proposer
    assert edits.files == {"pkg/a.py": "def f(x):\n    return -x < 1\n"}
    assert (edits.trials, edits.kept, edits.reverted) == (3, 1, 1)
    assert not edits.last_trial_kept
    assert edits.tried == {("pkg/a.py", digest(source.replace("x < 1", "x <= 1")))}
    assert edits.tried_lines == {("pkg/a.py", "x < 1")}
    # The bug-fix proposer reads the same digest.
    situation = _read_situation(history)
    assert situation.files == edits.files and situation.tried == edits.tried
    assert (situation.trials, situation.trials_reverted) == (3, 1)
