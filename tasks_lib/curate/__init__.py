"""Task curation: admit a task into the library only when it is valid, stable (no test flips over
N fresh-sandbox runs and reordered runs), new (not the same task as one in this batch or an
earlier admitted one) and uncontaminated (under the chosen decontamination policy); measure its
difficulty for stratified sampling. See `pipeline` for the order of the steps, `fingerprint` and
`similarity` for what makes two tasks one.
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
from tasks_lib.curate.fingerprint import PARTS, Fingerprint
from tasks_lib.curate.pipeline import (
    AdmittedTask,
    TaskChecks,
    TaskVerdict,
    check_task_dir,
    curate_tasks,
    decide,
    earlier_admitted,
    load_eval_set,
    task_fingerprint,
    verdict_rows,
)
from tasks_lib.curate.reasons import RULES, Reason
from tasks_lib.curate.settings import CurationSettings, reruns_for
from tasks_lib.curate.similarity import (
    DEFAULT_POLICY,
    POLICIES,
    Decontamination,
    EvalSet,
    check_policy,
)
from tasks_lib.errors import CurationError, CurationSettingsError

__all__ = [
    "ALL_FAIL",
    "ALL_PASS",
    "DEFAULT_POLICY",
    "PARTS",
    "POLICIES",
    "RULES",
    "AdmittedTask",
    "CurationError",
    "CurationSettings",
    "CurationSettingsError",
    "Decontamination",
    "DifficultyEstimate",
    "EvalSet",
    "Fingerprint",
    "Reason",
    "Sampler",
    "TaskChecks",
    "TaskVerdict",
    "bucket_for",
    "check_policy",
    "check_task_dir",
    "curate_tasks",
    "decide",
    "earlier_admitted",
    "estimate_difficulty",
    "load_eval_set",
    "reruns_for",
    "stratified_sample",
    "task_fingerprint",
    "verdict_rows",
]
