"""The built-in policy's one feature space, and the candidate actions described in it.

Every proposer (`training.builtin.bugfix`, `training.builtin.proposers`) describes each candidate
action as a vector over `FEATURE_NAMES`: the bug-fix block first, then one block per other task
family. The order is part of a checkpoint (the network's input), so names are only ever appended.
Every name describes an action or the situation in general terms — what kind of action, whether
its parts match words of the question, where an edit lands relative to the last error — never
which candidate is the answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from training.actions import Action


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    """One action the policy may take, and its features."""

    action: Action
    features: tuple[float, ...]
    label: str
    """Short description for logs ("try calc.py:12 comparison '<'->'<='")."""


# -- bug fixing (`training.builtin.bugfix`) ------------------------------------------------------

MUTATION_KINDS = (
    "comparison",
    "arithmetic",
    "off_by_one",
    "boolean",
    "wrong_variable",
    "missing_call",
    "return_value",
)
EVIDENCE_KINDS = (
    "numbers_one_apart",
    "numbers_further_apart",
    "sign_differs",
    "bool_mismatch",
    "none_mismatch",
    "order_differs",
    "case_differs",
    "type_differs",
    "exception_raised",
    "no_evidence",
)
"""What the failing assertions look like (`no_evidence`: the tests have not been run, or the
output showed none of the others)."""

BUGFIX_FEATURE_NAMES: tuple[str, ...] = (
    # what kind of action
    "is_run_tests",
    "is_list_files",
    "is_read",
    "is_try_edit",
    "is_submit",
    # running the tests and submitting, given the situation
    "run_tests_never_run",
    "submit_tests_failing",
    "submit_before_any_trial",
    # reading
    "read_source_of_failing_test",
    "read_named_by_failure",
    # where a trial's edit lands, and whether it was tried
    "edit_in_failing_function",
    "edit_line_in_traceback",
    "edit_line_tried_before",
    # what a variable swap brings in
    "edit_name_never_read",
    "edit_name_repeated_on_line",
    # what a trial's edit does (one-hot over MUTATION_KINDS) ...
    *(f"edit_kind_{kind}" for kind in MUTATION_KINDS),
    # ... crossed with what the failure looks like: the network learns which fit which
    *(f"{kind}_given_{evidence}" for kind in MUTATION_KINDS for evidence in EVIDENCE_KINDS),
    # the situation (the same for every candidate; the hidden layer crosses it with the rest)
    "tests_run",
    "step_fraction",
    "trials_reverted_scaled",
    "last_trial_kept",
)


# -- the other families (`training.builtin.proposers`) ----------------------------------------

AGGREGATIONS = ("count", "sum", "mean", "median", "min", "max")
"""The aggregations a data-analysis script may compute."""
SHAPES = ("table", "scalar", "list")
"""What an answer holds: one row per group, one number, or a ranked list of group names."""

DATA_FEATURE_NAMES: tuple[str, ...] = (
    # what kind of action
    "data_is_profile",
    "data_is_read_script",
    "data_is_script",
    "data_is_submit",
    "data_submit_without_answer",
    # a candidate script: its aggregation ...
    *(f"data_agg_{name}" for name in AGGREGATIONS),
    "data_agg_cued",
    "data_agg_other_cued",
    # ... the measure it aggregates ...
    "data_measure_none",
    "data_measure_column",
    "data_measure_product",
    "data_measure_named",
    "data_measure_product_stated",
    # ... its filter ...
    "data_filter_none",
    "data_filter_covers_quoted",
    "data_filter_partial",
    "data_filter_agrees_with_negation",
    "data_filter_contradicts_negation",
    # ... its grouping and answer shape
    "data_group_is_output_key",
    "data_group_derived",
    *(f"data_shape_{name}" for name in SHAPES),
    "data_limit_from_question",
    # the situation
    "data_profiled",
    "data_step_fraction",
    "data_scripts_failed_scaled",
)

OPS_EDIT_KINDS = (
    "config_address",
    "config_mode",
    "config_number",
    "config_bool",
    "rename_in_code",
    "rename_in_sql",
)
"""What a troubleshooting edit changes: a listen address, a file mode, a number or a flag of a
configuration file, or a name (a key, a column) the error says does not exist."""
OPS_EVIDENCE_KINDS = (
    "address_error",
    "permission_error",
    "missing_column",
    "missing_key",
    "http_error",
    "crash_loop",
    "no_evidence",
)
"""What the last failing run's output shows."""

OPS_READ_KINDS = ("config", "code", "sql", "data", "doc")
"""What a file to read holds, by its name."""

OPS_FEATURE_NAMES: tuple[str, ...] = (
    # what kind of action
    "ops_is_check",
    "ops_is_list_files",
    "ops_is_read",
    "ops_is_try_edit",
    "ops_is_submit",
    "ops_check_never_run",
    "ops_submit_checks_failing",
    "ops_submit_before_any_trial",
    # reading
    "ops_read_in_traceback",
    "ops_read_named_in_output",
    "ops_read_named_in_instruction",
    "ops_read_referenced_by_read_file",
    "ops_read_config",
    "ops_read_code",
    "ops_read_sql",
    "ops_read_data",
    "ops_read_doc",
    # ... crossed with what the failure shows
    *(
        f"ops_read_{kind}_given_{evidence}"
        for kind in OPS_READ_KINDS
        for evidence in OPS_EVIDENCE_KINDS
    ),
    # where an edit lands, and whether it was tried
    "ops_edit_in_traceback_file",
    "ops_edit_line_in_traceback",
    "ops_edit_line_tried_before",
    # what a rename brings in
    "ops_rename_name_in_error",
    "ops_rename_name_not_in_data",
    "ops_rename_to_data_column",
    "ops_rename_shares_word",
    # what a config edit sets
    "ops_mode_owner_writable",
    "ops_address_drops_port",
    # what an edit does (one-hot) crossed with what the failure shows
    *(f"ops_edit_{kind}" for kind in OPS_EDIT_KINDS),
    *(f"ops_{kind}_given_{evidence}" for kind in OPS_EDIT_KINDS for evidence in OPS_EVIDENCE_KINDS),
    # the situation
    *(f"ops_evidence_{evidence}" for evidence in OPS_EVIDENCE_KINDS),
    "ops_checks_run",
    "ops_listed",
    "ops_step_fraction",
    "ops_trials_reverted_scaled",
)

FAMILY_FEATURE_NAMES: tuple[str, ...] = (*DATA_FEATURE_NAMES, *OPS_FEATURE_NAMES)
"""The other families' block, appended to the bug-fix features."""


# -- the whole space -----------------------------------------------------------------------------

FEATURE_NAMES: tuple[str, ...] = (*BUGFIX_FEATURE_NAMES, *FAMILY_FEATURE_NAMES)
FEATURE_COUNT = len(FEATURE_NAMES)
FEATURE_INDEX: dict[str, int] = {name: index for index, name in enumerate(FEATURE_NAMES)}


def feature_vector(active: Mapping[str, float]) -> tuple[float, ...]:
    """A vector of the full feature space with `active` set and every other feature 0."""
    values = [0.0] * FEATURE_COUNT
    for name, value in active.items():
        values[FEATURE_INDEX[name]] = float(value)
    return tuple(values)
