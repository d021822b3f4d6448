"""Runs the iteration gate's suites over its frames through GX checkpoints in the store's GX
project, turns each expectation result into a `GateResult`, and renders the run's Data Docs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from storage.gate_suites import Check, SuiteName, described, synced_suite
from storage.gx_project import (
    DOCS_SITE,
    ITERATION_SUITE_PREFIX,
    dataframe_batch,
    gate_docs_pages_for,
    open_context,
)
from storage.tables.gates import GateResult

if TYPE_CHECKING:
    import pandas as pd

# Which frame each suite validates.
_SUITE_FRAMES: dict[str, str] = {
    "batch": "episodes",
    "episodes": "episodes",
    "drift": "episodes",
    "groups": "groups",
}


def run_suites(
    store_root: str,
    run_name: str,
    checks: Sequence[Check],
    suites: Sequence[SuiteName],
    parameters: dict[str, float],
    frames: Mapping[str, pd.DataFrame],
) -> tuple[list[GateResult], dict[str, str], list[str]]:
    """Run the iteration suites through GX checkpoints in the store's GX project, Data Docs
    rendered for this run; returns the results, the expected text of each result and the
    run's Data Docs pages."""
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
    )

    context = open_context(store_root)
    expected_of: dict[str, str] = {}
    results: list[GateResult] = []
    run_id = RunIdentifier(run_name=run_name)
    rendered: list[Any] = []
    for frame_name in ("episodes", "groups"):
        chosen = [name for name in suites if _SUITE_FRAMES[name] == frame_name]
        if not chosen:
            continue
        batch_definition = dataframe_batch(context, frame_name)
        definitions = []
        for suite_name in chosen:
            suite = synced_suite(context, suite_name, [c for c in checks if c.suite == suite_name])
            rendered.append(ExpectationSuiteIdentifier(name=suite.name))
            definitions.append(
                context.validation_definitions.add_or_update(
                    gx.ValidationDefinition(name=suite.name, data=batch_definition, suite=suite)
                )
            )
        # No actions on the checkpoint: GX's UpdateDataDocsAction rebuilds the site index once
        # per validation result (four times a gate), which cost ~65% of a gate; the docs are
        # built once for the whole gate run below.
        checkpoint = context.checkpoints.add_or_update(
            gx.Checkpoint(
                name=f"{ITERATION_SUITE_PREFIX}{frame_name}",
                validation_definitions=definitions,
                actions=[],
                result_format="SUMMARY",
            )
        )
        outcome = checkpoint.run(
            batch_parameters={"dataframe": frames[frame_name]},
            expectation_parameters=parameters,
            run_id=run_id,
        )
        rendered.extend(outcome.run_results)
        by_name = {c.name: c for c in checks}
        for validation in outcome.run_results.values():
            for result in validation.results:
                name, expected = described(result.expectation_config, by_name, parameters)
                expected_of[name] = expected
                results.append(_gate_result(name, result))
    if rendered:
        context.build_data_docs(site_names=[DOCS_SITE], resource_identifiers=rendered)
    pages = [str(page) for page in gate_docs_pages_for(store_root, run_name)]
    return results, expected_of, pages


def _gate_result(name: str, result: Any) -> GateResult:
    info = result.exception_info or {}
    if info.get("raised_exception"):
        message = str(info.get("exception_message") or "expectation raised").splitlines()[0]
        return GateResult(name, False, observed="error", details=message[:500])
    body = result.result or {}
    observed = body.get("observed_value")
    details = result.expectation_config.type
    if "unexpected_count" in body:
        count = body.get("unexpected_count") or 0
        observed = f"{count} unexpected" + (
            f" of {body['element_count']}" if body.get("element_count") is not None else ""
        )
        sample = body.get("partial_unexpected_list") or []
        if sample:
            details += f"; e.g. {[_short(v) for v in sample[:3]]}"
    return GateResult(name, bool(result.success), observed=_short(observed), details=details)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else f"{value:.4g}"
    if isinstance(value, dict) and "values" in value:
        return ", ".join(
            f"p{round(q * 100)}={_short(v)}"
            for q, v in zip(value.get("quantiles", []), value["values"], strict=False)
        )
    text = str(value)
    return text if len(text) <= 120 else text[:117] + "..."
