"""Task curation: admit a task into the library only when it is valid, stable (no test flips over
N fresh-sandbox runs and reordered runs), new (no exact or near duplicate) and uncontaminated;
measure its difficulty for stratified sampling. See `pipeline` for the order of the steps.

    runs.py (oracle runs through the verifier) · checks.py (validity, flakiness) ·
    similarity.py (duplicates, contamination) · difficulty.py · review_gate.py ·
    settings.py · reasons.py · pipeline.py (the map step per task, the reduce step over all)
"""

from tasks_lib.curate.difficulty import (
    ALL_FAIL,
    ALL_PASS,
    DifficultyEstimate,
    Sampler,
    bucket_for,
    estimate_difficulty,
    stratified_sample,
)
from tasks_lib.curate.pipeline import (
    TaskChecks,
    TaskVerdict,
    check_task_dir,
    curate_tasks,
    decide,
    load_eval_set,
    verdict_rows,
)
from tasks_lib.curate.reasons import RULES, Reason
from tasks_lib.curate.settings import CurationSettings, reruns_for
from tasks_lib.errors import CurationError, CurationSettingsError

__all__ = [
    "ALL_FAIL",
    "ALL_PASS",
    "RULES",
    "CurationError",
    "CurationSettings",
    "CurationSettingsError",
    "DifficultyEstimate",
    "Reason",
    "Sampler",
    "TaskChecks",
    "TaskVerdict",
    "bucket_for",
    "check_task_dir",
    "curate_tasks",
    "decide",
    "estimate_difficulty",
    "load_eval_set",
    "reruns_for",
    "stratified_sample",
    "verdict_rows",
]
