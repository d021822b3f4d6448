"""Quality gates over each iteration's committed batch, as Great Expectations 1.x suites.

One call decides whether the trainer may consume an iteration:

    report = gate_iteration(store, run_id, iteration, GateSettings.from_env())
    if report.quarantined and report.should_stop: ...   # settings.on_failure == "stop"
    create_table_artifact(table=report.table_rows(), ...)

The gate validates two frames built from the store's `episodes` table: one row per episode
(schema and ids, reward bounds, NaN, infra errors kept apart from reward 0, infra-error and
hack-flag rates, step-count and wall-time quantiles, reward drift against recent iterations) and
one row per GRPO group (share of zero-variance groups). Rates are means of 0/1 columns, so GX's
observed value is the rate itself. Results go to the `gates` table; a failing gate records a
quarantined verdict, which `read_episodes` and the `training_episodes` view obey.

Great Expectations takes 5-13 s to import, so it is imported inside `gate_iteration` only. This
module decides what is checked; `storage.gate_suites` keeps the persisted GX suites in step with
it, and `storage.gate_checkpoints` runs them and renders the Data Docs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, get_args

import pyarrow as pa
import pyarrow.compute as pc

from rollyard.settings import settings
from rollyard.status import ALL_STATUSES, is_trainable
from storage.errors import GateSettingsError
from storage.gate_checkpoints import run_suites
from storage.gate_suites import Check, SuiteName
from storage.gx_project import gate_run_name
from storage.store import TrajectoryStore
from storage.tables.gates import GateResult

if TYPE_CHECKING:
    import pandas as pd

ITERATION_SUITE = "iteration"
"""Suite name under which `gate_iteration` records its results in the `gates` table."""

OnFailure = Literal["continue", "stop"]
# The defaults of the status classes, from the one status vocabulary (in its order).
_TRAINABLE = tuple(status for status in ALL_STATUSES if is_trainable(status))
_INFRASTRUCTURE = tuple(status for status in ALL_STATUSES if not is_trainable(status))
ENV_PREFIX = "ROLLYARD_GATE_"

_EPISODE_COLUMNS = (
    "episode_id",
    "run_id",
    "iteration",
    "task_id",
    "group_index",
    "sample_index",
    "attempt",
    "status",
    "reward",
    "flags",
    "n_steps",
    "wall_s",
)


@dataclasses.dataclass(frozen=True, slots=True)
class GateSettings:
    """Thresholds of the iteration gate. Defaults follow research/threats-and-quality.md §5;
    tune them on a baseline run. Every field can be set from `ROLLYARD_GATE_<FIELD>`."""

    on_failure: OnFailure = "continue"
    """What the flow does after a failing gate: `continue` (the iteration is quarantined and
    training goes on with the next one) or `stop` (the run stops after quarantining it)."""
    reward_min: float = 0.0
    """Smallest reward a verdict can give."""
    reward_max: float = 1.0
    """Largest reward a verdict can give."""
    trainable_statuses: tuple[str, ...] = _TRAINABLE
    """Statuses whose reward judges the policy; they must carry a finite reward (default:
    `rollyard.status.TRAINABLE_STATUSES`)."""
    infra_statuses: tuple[str, ...] = _INFRASTRUCTURE
    """Statuses where the environment, not the policy, decided: they must carry no reward
    (default: `rollyard.status.INFRASTRUCTURE_STATUSES`)."""
    max_infra_error_rate: float = 0.05
    """Largest share of episodes with an infra status (DQ-3 gates at 2-5%)."""
    max_zero_variance_group_share: float = 0.95
    """Largest share of GRPO groups (>= 2 scored samples) whose rewards are all equal; such
    groups give zero advantage (DAPO `filter_groups`)."""
    max_hack_flag_rate: float = 0.05
    """Largest share of episodes carrying a guard flag other than `benign_flags`."""
    benign_flags: tuple[str, ...] = ("missing_tests", "missing_report", "bytecode_cache")
    """Guard rules that say a candidate broke, not that it cheated; not counted as hack flags."""
    n_steps_p50_max: float = 200.0
    """Upper bound of the median step count."""
    n_steps_p99_max: float = 1000.0
    """Upper bound of the 99th-percentile step count."""
    wall_s_p99_max: float = 3600.0
    """Upper bound of the 99th-percentile episode wall time, seconds."""
    drift_window: int = 3
    """How many earlier non-quarantined iterations of the run form the reward reference."""
    max_reward_mean_shift: float = 0.5
    """Largest distance of the iteration's mean scored reward from the reference mean."""
    min_episodes: int = 1
    """Fewest committed episodes an iteration may have."""

    def __post_init__(self) -> None:
        if self.on_failure not in get_args(OnFailure):
            raise GateSettingsError(
                f"GateSettings.on_failure = {self.on_failure!r}; use 'continue' or 'stop'"
            )
        for name in (
            "max_infra_error_rate",
            "max_zero_variance_group_share",
            "max_hack_flag_rate",
        ):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise GateSettingsError(f"GateSettings.{name} = {value}; a share lies in [0, 1]")
        if not self.reward_min <= self.reward_max:
            raise GateSettingsError(
                f"GateSettings.reward_min = {self.reward_min} exceeds reward_max = "
                f"{self.reward_max}"
            )
        if self.drift_window < 0 or self.min_episodes < 0 or self.max_reward_mean_shift < 0:
            raise GateSettingsError(
                "GateSettings.drift_window, min_episodes and max_reward_mean_shift must be >= 0"
            )
        unknown = set(self.trainable_statuses + self.infra_statuses) - set(ALL_STATUSES)
        if unknown:
            raise GateSettingsError(
                f"GateSettings names unknown episode status(es) {sorted(unknown)}; "
                f"known: {', '.join(ALL_STATUSES)}"
            )

    @classmethod
    def from_env(cls, texts: Mapping[str, str] | None = None, **overrides: Any) -> GateSettings:
        """Settings from `ROLLYARD_GATE_<FIELD>` variables (read by `rollyard.settings`; tuples
        comma-separated), or from `texts` by field name when given, then `overrides`. Read when
        called, never at import."""
        texts = settings().gate if texts is None else texts
        values: dict[str, Any] = {}
        defaults = cls()
        for field in dataclasses.fields(cls):
            text = texts.get(field.name)
            if text is None:
                continue
            default = getattr(defaults, field.name)
            try:
                if isinstance(default, tuple):
                    values[field.name] = tuple(p.strip() for p in text.split(",") if p.strip())
                elif isinstance(default, bool):
                    values[field.name] = text.strip().lower() in ("1", "true", "yes")
                elif isinstance(default, int):
                    values[field.name] = int(text)
                elif isinstance(default, float):
                    values[field.name] = float(text)
                else:
                    values[field.name] = text.strip()
            except ValueError:
                raise GateSettingsError(
                    f"{ENV_PREFIX}{field.name.upper()} = {text!r} is not a valid "
                    f"{type(default).__name__}"
                ) from None
        values.update(overrides)
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise GateSettingsError(f"unknown gate setting(s): {sorted(unknown)}")
        return cls(**values)


@dataclasses.dataclass(frozen=True, slots=True)
class GateReport:
    """What one gate evaluation found and decided."""

    run_id: str
    iteration: int
    suite: str
    evaluation: int
    """Evaluation number in the `gates` table (0 for the first, +1 for each re-gate)."""
    n_episodes: int
    results: tuple[GateResult, ...]
    thresholds: Mapping[str, str]
    """Expectation name -> what it expects, for the report table."""
    quarantined: bool
    on_failure: OnFailure
    duration_s: float
    docs_pages: tuple[str, ...] = ()
    """The GX Data Docs pages of this evaluation (one per suite run), inside the store."""

    @property
    def passed(self) -> bool:
        return not self.quarantined

    @property
    def failed(self) -> tuple[GateResult, ...]:
        return tuple(r for r in self.results if not r.success)

    @property
    def should_stop(self) -> bool:
        """The run should stop: the gate failed and the settings say `stop`."""
        return self.quarantined and self.on_failure == "stop"

    @property
    def reason(self) -> str | None:
        """One line naming every failed expectation, or None when the gate passed."""
        if not self.quarantined:
            return None
        return "; ".join(
            f"{r.expectation}: observed {r.observed}, expected {self.thresholds.get(r.expectation, '?')}"
            for r in self.failed
        )

    def table_rows(self, *, failed_only: bool = True) -> list[dict[str, str]]:
        """Rows for a Prefect table artifact: expectation, observed, expected, details."""
        chosen = self.failed if failed_only else self.results
        return [
            {
                "expectation": r.expectation,
                "success": str(r.success),
                "observed": r.observed or "",
                "expected": self.thresholds.get(r.expectation, ""),
                "details": r.details or "",
            }
            for r in chosen
        ]


def gate_iteration(
    store: TrajectoryStore,
    run_id: str,
    iteration: int,
    settings: GateSettings | None = None,
    *,
    expected_episodes: int | None = None,
) -> GateReport:
    """Validate the committed batch of (run_id, iteration), record the results and the verdict
    in the `gates` table (suite `iteration`) and return the report.

    A failing gate quarantines the iteration: its data stays, the trainer no longer reads it.
    Calling again re-evaluates and records a new evaluation; the latest one decides.
    `expected_episodes`, when given, must equal the committed row count (nothing lost).
    """
    started = time.monotonic()
    settings = settings or GateSettings()
    table = store.read_episodes(
        run_id, iteration, include_quarantined=True, columns=list(_EPISODE_COLUMNS)
    )
    episodes = _episode_frame(table, settings)
    groups = _group_frame(table, settings)
    reference = _reference_mean(store, run_id, iteration, settings)
    evaluation = _next_evaluation(store, run_id, iteration)
    checks, parameters = _checks(
        settings,
        n_rows=table.num_rows,
        expected_episodes=expected_episodes,
        reference=reference,
    )
    suites: list[SuiteName] = ["batch"]
    if table.num_rows:
        suites.append("episodes")
    if reference is not None:
        suites.append("drift")
    if len(groups) > 0:
        suites.append("groups")
    results, expected_of, docs_pages = run_suites(
        store.root,
        gate_run_name(run_id, iteration, evaluation),
        checks,
        suites,
        parameters,
        {"episodes": episodes, "groups": groups},
    )
    if reference is None:
        results.append(
            GateResult(
                "reward_drift",
                True,
                observed="no reference",
                details="no earlier non-quarantined iteration with scored rewards",
            )
        )
    if len(groups) == 0 and table.num_rows:
        results.append(
            GateResult(
                "zero_variance_group_share",
                True,
                observed="no groups",
                details="no group has two or more scored samples",
            )
        )
    thresholds = dict(expected_of)
    thresholds.setdefault("reward_drift", f"|mean - reference| <= {settings.max_reward_mean_shift}")
    thresholds.setdefault(
        "zero_variance_group_share", f"<= {settings.max_zero_variance_group_share}"
    )
    quarantined = not all(r.success for r in results)
    report = GateReport(
        run_id=run_id,
        iteration=iteration,
        suite=ITERATION_SUITE,
        evaluation=evaluation,
        n_episodes=table.num_rows,
        results=tuple(results),
        thresholds=thresholds,
        quarantined=quarantined,
        on_failure=settings.on_failure,
        duration_s=0.0,
        docs_pages=tuple(docs_pages),
    )
    store.gates.record(
        run_id,
        iteration,
        ITERATION_SUITE,
        report.results,
        quarantined=quarantined,
        reason=report.reason,
        evaluation=evaluation,
    )
    return dataclasses.replace(report, duration_s=time.monotonic() - started)


# -- frames ---------------------------------------------------------------------------------------


def _episode_frame(table: pa.Table, settings: GateSettings) -> pd.DataFrame:
    """One row per episode, with 0/1 indicator columns whose means are the gated rates."""
    status = table["status"]
    reward = table["reward"]
    trainable = pc.is_in(status, value_set=pa.array(settings.trainable_statuses, pa.string()))
    infra = pc.is_in(status, value_set=pa.array(settings.infra_statuses, pa.string()))
    is_nan = pc.fill_null(pc.is_nan(reward), False)
    frame = pa.table(
        {
            "episode_id": table["episode_id"],
            "status": status,
            "reward": reward,
            "attempt": table["attempt"],
            "n_steps": table["n_steps"],
            "wall_s": table["wall_s"],
            "reward_is_nan": is_nan,
            # A scored status without a finite reward lost its verdict somewhere.
            "scored_reward_missing": pc.and_(trainable, pc.or_(pc.is_null(reward), is_nan)),
            # Infra failures carry no reward at all, never a 0 (kept apart from the policy's 0).
            "infra_reward": pc.if_else(infra, reward, pa.scalar(None, pa.float64())),
            "is_infra_error": pc.cast(infra, pa.float64()),
            "has_hack_flag": pc.cast(_hack_flagged(table["flags"], settings), pa.float64()),
            "scored_reward": pc.if_else(
                pc.and_(trainable, pc.invert(is_nan)), reward, pa.scalar(None, pa.float64())
            ),
        }
    )
    return frame.to_pandas()


def _hack_flagged(flags: pa.ChunkedArray, settings: GateSettings) -> pa.Array:
    """Per episode: does any flag name a rule outside `benign_flags`? Flags are `rule:path`."""
    flags = flags.combine_chunks()
    flat = pc.list_flatten(flags)
    flagged = [False] * len(flags)
    if len(flat):
        rules = pc.list_element(pc.split_pattern(flat, ":", max_splits=1), 0)
        hack = pc.invert(pc.is_in(rules, value_set=pa.array(settings.benign_flags, pa.string())))
        parents = pc.list_parent_indices(flags).to_numpy()
        for parent, is_hack in zip(parents, hack.to_numpy(zero_copy_only=False), strict=True):
            if is_hack:
                flagged[parent] = True
    return pa.array(flagged, pa.bool_())


def _group_frame(table: pa.Table, settings: GateSettings) -> pd.DataFrame:
    """One row per GRPO group with >= 2 scored samples: is every reward in it equal?"""
    import pandas as pd

    trainable = pc.is_in(table["status"], value_set=pa.array(settings.trainable_statuses))
    scored = table.select(["task_id", "group_index", "reward"]).filter(
        pc.and_(trainable, pc.is_finite(pc.fill_null(table["reward"], float("nan"))))
    )
    if scored.num_rows == 0:
        return pd.DataFrame({"zero_variance": pd.Series([], dtype="float64")})
    grouped = scored.group_by(["task_id", "group_index"]).aggregate(
        [("reward", "min"), ("reward", "max"), ("reward", "count")]
    )
    grouped = grouped.filter(pc.greater_equal(grouped["reward_count"], 2))
    equal = pc.equal(grouped["reward_min"], grouped["reward_max"])
    return pd.DataFrame({"zero_variance": pc.cast(equal, pa.float64()).to_numpy()})


def _reference_mean(
    store: TrajectoryStore, run_id: str, iteration: int, settings: GateSettings
) -> float | None:
    """Mean scored reward of the previous `drift_window` non-quarantined iterations."""
    if settings.drift_window == 0 or iteration == 0:
        return None
    statuses = ", ".join(f"'{s}'" for s in settings.trainable_statuses if "'" not in s)
    rows = store.query(
        f"""SELECT avg(reward) AS mean, count(reward) AS n FROM training_episodes
            WHERE run_id = ? AND iteration < ? AND iteration >= ? AND status IN ({statuses})
              AND isfinite(reward)""",
        [run_id, iteration, iteration - settings.drift_window],
    ).to_pylist()
    if not rows or not rows[0]["n"]:
        return None
    return float(rows[0]["mean"])


def _next_evaluation(store: TrajectoryStore, run_id: str, iteration: int) -> int:
    rows = store.query(
        "SELECT max(evaluation) AS last FROM gates WHERE run_id = ? AND iteration = ? AND suite = ?",
        [run_id, iteration, ITERATION_SUITE],
    ).to_pylist()
    last = rows[0]["last"] if rows else None
    return 0 if last is None else int(last) + 1


# -- the suite ------------------------------------------------------------------------------------


def _checks(
    settings: GateSettings,
    *,
    n_rows: int,
    expected_episodes: int | None,
    reference: float | None,
) -> tuple[list[Check], dict[str, float]]:
    """Every expectation rollyard keeps in the iteration suites, from the settings, and the
    suite parameters of this evaluation (what varies per iteration: the scheduled row count,
    the drift bounds). Which suites run is decided by the caller."""
    import importlib

    # GX exports its expectation classes without `__all__`; strict mypy would flag each one.
    gxe: Any = importlib.import_module("great_expectations.expectations")

    s = settings
    # Without a schedule the committed count is what was expected; without a reference the
    # drift suite does not run (its bounds are then unused).
    low, high = (
        (reference - s.max_reward_mean_shift, reference + s.max_reward_mean_shift)
        if reference is not None
        else (s.reward_min, s.reward_max)
    )
    parameters = {
        "expected_episodes": float(n_rows if expected_episodes is None else expected_episodes),
        "reward_mean_min": low,
        "reward_mean_max": high,
    }
    checks = [
        Check(
            "episode_count",
            f">= {settings.min_episodes}",
            "batch",
            gxe.ExpectTableRowCountToBeBetween(min_value=settings.min_episodes),
        ),
        Check(
            "episodes_as_scheduled",
            f"== {expected_episodes}" if expected_episodes is not None else "no schedule given",
            "batch",
            gxe.ExpectTableRowCountToEqual(value={"$PARAMETER": "expected_episodes"}),
        ),
    ]
    checks += [
        Check(
            "episode_id_not_null",
            "no null ids",
            "episodes",
            gxe.ExpectColumnValuesToNotBeNull(column="episode_id"),
        ),
        Check(
            "episode_id_unique",
            "no id twice",
            "episodes",
            gxe.ExpectColumnValuesToBeUnique(column="episode_id"),
        ),
        Check(
            "status_known",
            f"in {list(ALL_STATUSES)}",
            "episodes",
            gxe.ExpectColumnValuesToBeInSet(column="status", value_set=list(ALL_STATUSES)),
        ),
        Check(
            "attempt_non_negative",
            ">= 0",
            "episodes",
            gxe.ExpectColumnValuesToBeBetween(column="attempt", min_value=0),
        ),
        Check(
            "reward_in_range",
            f"in [{s.reward_min}, {s.reward_max}]",
            "episodes",
            gxe.ExpectColumnValuesToBeBetween(
                column="reward", min_value=s.reward_min, max_value=s.reward_max
            ),
        ),
        Check(
            "reward_not_nan",
            "no NaN reward",
            "episodes",
            gxe.ExpectColumnValuesToBeInSet(column="reward_is_nan", value_set=[False]),
        ),
        Check(
            "scored_reward_present",
            f"statuses {list(s.trainable_statuses)} carry a reward",
            "episodes",
            gxe.ExpectColumnValuesToBeInSet(column="scored_reward_missing", value_set=[False]),
        ),
        Check(
            "infra_errors_unscored",
            f"statuses {list(s.infra_statuses)} carry no reward",
            "episodes",
            gxe.ExpectColumnValuesToBeNull(column="infra_reward"),
        ),
        Check(
            "infra_error_rate",
            f"<= {s.max_infra_error_rate}",
            "episodes",
            gxe.ExpectColumnMeanToBeBetween(
                column="is_infra_error", min_value=0.0, max_value=s.max_infra_error_rate
            ),
        ),
        Check(
            "hack_flag_rate",
            f"<= {s.max_hack_flag_rate}",
            "episodes",
            gxe.ExpectColumnMeanToBeBetween(
                column="has_hack_flag", min_value=0.0, max_value=s.max_hack_flag_rate
            ),
        ),
        # Quantile bounds as GX's median and `mostly` expectations: "at least 99% of the
        # values <= x" is "p99 <= x". (GX 1.24's quantile expectation stores numpy booleans
        # that its own file stores cannot serialize.)
        Check(
            "n_steps_p50",
            f"<= {s.n_steps_p50_max}",
            "episodes",
            gxe.ExpectColumnMedianToBeBetween(column="n_steps", max_value=s.n_steps_p50_max),
        ),
        Check(
            "n_steps_p99",
            f"<= {s.n_steps_p99_max}",
            "episodes",
            gxe.ExpectColumnValuesToBeBetween(
                column="n_steps", max_value=s.n_steps_p99_max, mostly=0.99
            ),
        ),
        Check(
            "wall_s_p99",
            f"<= {s.wall_s_p99_max}",
            "episodes",
            gxe.ExpectColumnValuesToBeBetween(
                column="wall_s", max_value=s.wall_s_p99_max, mostly=0.99
            ),
        ),
    ]
    checks.append(
        Check(
            "reward_drift",
            f"mean in [{low:.3f}, {high:.3f}] (reference {reference:.3f})"
            if reference is not None
            else "no reference",
            "drift",
            gxe.ExpectColumnMeanToBeBetween(
                column="scored_reward",
                min_value={"$PARAMETER": "reward_mean_min"},
                max_value={"$PARAMETER": "reward_mean_max"},
            ),
        )
    )
    checks.append(
        Check(
            "zero_variance_group_share",
            f"<= {s.max_zero_variance_group_share}",
            "groups",
            gxe.ExpectColumnMeanToBeBetween(
                column="zero_variance", min_value=0.0, max_value=s.max_zero_variance_group_share
            ),
        )
    )
    return checks, parameters
