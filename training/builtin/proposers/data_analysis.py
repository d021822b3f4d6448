"""Candidate actions for data-analysis tasks: a question about a data file, answered by a script.

The proposer reads the instruction the way an analyst reads a ticket: which data file, which
script to edit and how it is run, which answer file to write and in what form (a table with the
columns it names, a JSON number, a JSON list), and the question itself. It profiles the data
once (columns, types, the values of low-cardinality columns) and then proposes candidate scripts
from a small grammar:

    aggregation (count, sum, mean, median, min, max)
  x measure     (a numeric column, or the product of two)
  x filter      (each value the question quotes, or a year it names: =, <> or not used)
  x grouping    (the answer's key: a column, or a month / year derived from a date column)
  x shape       (read from the instruction: table, number, ranked list of at most k names)

Aggregations are the ones whose usual words appear in the question (plus `count`, and `sum` when
none does); measures are the numeric columns the question names (all of them when it names
none). Each script is one trial (`TryEdit`): write it, run the instruction's command, keep it only
if it wrote a non-empty answer — which says nothing about whether the answer is right.

Features say how a script's parts relate to the question — its aggregation's words appear, its
measure's columns are named or written multiplied, its filter uses every quoted value, `<>`
where a negation precedes the value — never which script is right; the network learns from
rewards which of them pay.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Iterator

from training.actions import History, ReadFile, RunCommand, Submit, TryEdit
from training.builtin.features import AGGREGATIONS, Candidate, feature_vector
from training.builtin.proposers.base import (
    STEP_HORIZON,
    backticked,
    digest,
    follow_edits,
    normalize_path,
    paragraphs,
)

DATA_EXTENSIONS = (".csv", ".parquet", ".tsv")
_WRITE = re.compile(r"\b[Ww]rites?\s+`([^`\n]+)`")
_RUN_SCRIPT = re.compile(r"^(?:python3?|uv run)\s+(\S+\.py)(?:\s.*)?$")
_JSON_TEMPLATE = re.compile(r'^\{\s*"(\w+)"\s*:\s*(.+?)\s*\}$')
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]*$")
_WORD = re.compile(r"[a-z][a-z0-9_]*")
_YEAR = re.compile(r"\b(1[89]\d\d|2\d\d\d)\b")
_SMALL_NUMBER = re.compile(r"(?<![\w.-])(\d{1,2})(?![\w.-])")
_DATE_VALUE = re.compile(r"^\d{4}-\d{2}-\d{2}")
_NEGATIONS = ("not", "no", "non", "excluding", "except", "without", "other than", "besides")

AGGREGATION_WORDS = {
    "count": ("how many", "number of", "count"),
    "sum": ("total", "sum"),
    "mean": ("average", "mean"),
    "median": ("median",),
    "min": ("minimum", "lowest", "smallest", "fewest"),
    "max": ("maximum", "highest", "largest", "biggest"),
}
"""The usual words of each aggregation (a word may start with one: `counting`, `totals`)."""
MEASURE_WORDS = {
    "quantity": ("units", "pieces", "quantity", "quantities"),
    "price": ("price", "prices", "cost"),
}
"""Everyday names of quantity-like and price-like columns."""
PRODUCT_WORDS = ("revenue", "sales", "turnover", "value", "amount")
"""Everyday names of a quantity times a price."""
_NUMERIC_TYPES = ("INT", "FLOAT", "DOUBLE", "DECIMAL", "REAL", "NUMERIC")
_MAX_CONDITIONS = 3
_MAX_VALUES_PROFILED = 12

PROFILE_SCRIPT = """\
import duckdb
con = duckdb.connect()
con.execute("CREATE VIEW t AS SELECT * FROM '{path}'")
print("rows", con.execute("SELECT count(*) FROM t").fetchone()[0])
for name, kind, *_ in con.execute("DESCRIBE t").fetchall():
    q = '"' + name.replace('"', '""') + '"'
    n, lo, hi = con.execute(f"SELECT count(DISTINCT {{q}}), min({{q}}), max({{q}}) FROM t").fetchone()
    values = ""
    if n <= {max_values}:
        rows = con.execute(f"SELECT DISTINCT {{q}} FROM t WHERE {{q}} IS NOT NULL ORDER BY 1")
        values = "|".join(str(row[0]) for row in rows.fetchall())
    print("\\t".join(["column", name, kind, str(n), str(lo), str(hi), values]))
"""

SCRIPT = '''\
"""{title}"""

import csv
import json

import duckdb


def plain(value):
    if value is None or isinstance(value, int | str):
        return value
    return round(float(value), 4)


con = duckdb.connect()
con.execute("CREATE VIEW data AS SELECT * FROM '{data_file}'")
rows = con.execute("""{query}""").fetchall()
{writer}'''

_TABLE_WRITER = """\
with open({output!r}, "w", newline="") as handle:
    out = csv.writer(handle)
    out.writerow({columns!r})
    for row in rows:
        out.writerow([plain(value) for value in row])
"""
_SCALAR_WRITER = """\
with open({output!r}, "w") as handle:
    json.dump({{{key!r}: plain(rows[0][0]) if rows else None}}, handle)
"""
_LIST_WRITER = """\
with open({output!r}, "w") as handle:
    json.dump({{{key!r}: [plain(row[0]) for row in rows]}}, handle)
"""

ANSWER_CHECK = """\
import csv, json, sys
path = {output!r}
try:
    text = open(path).read()
except OSError as error:
    sys.exit(f"no answer: {{error}}\\n1 failed")
print(text[:800])
if path.endswith(".json"):
    answer = json.loads(text)
    values = list(answer.values()) if isinstance(answer, dict) else [answer]
    empty = not values or any(v is None or v == [] for v in values)
else:
    empty = len(list(csv.reader(text.splitlines()))) < 2
if empty:
    sys.exit("the answer is empty\\n1 failed")
print("1 passed")
"""


@dataclasses.dataclass(frozen=True, slots=True)
class AnswerSpec:
    """What the instruction asks for, read from its text."""

    data_file: str
    script: str
    run_command: str
    output: str
    shape: str
    """`table`, `scalar` or `list` (see `features.SHAPES`)."""
    columns: tuple[str, ...]
    """A table's columns, as named (key first)."""
    key: str
    """A JSON answer's key (a table's first column)."""
    question: str
    """The question's paragraph(s), lower-cased."""


@dataclasses.dataclass(frozen=True, slots=True)
class Column:
    name: str
    kind: str
    distinct: int
    low: str
    high: str
    values: tuple[str, ...]

    @property
    def numeric(self) -> bool:
        return any(word in self.kind.upper() for word in _NUMERIC_TYPES)

    @property
    def date_like(self) -> bool:
        return (
            "DATE" in self.kind.upper()
            or "TIMESTAMP" in self.kind.upper()
            or bool(_DATE_VALUE.match(self.low) and _DATE_VALUE.match(self.high))
        )

    @property
    def id_like(self) -> bool:
        return self.name.lower() == "id" or self.name.lower().endswith("_id")


@dataclasses.dataclass(frozen=True, slots=True)
class Condition:
    """A value the question names, as a filter the script may apply."""

    left: str
    """SQL of the filtered expression."""
    value: str
    """SQL literal."""
    negated: bool
    """A negation word precedes the value in the question."""


@dataclasses.dataclass(frozen=True, slots=True)
class Grouping:
    sql: str
    name: str
    is_output_key: bool
    derived: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Measure:
    sql: str
    columns: tuple[str, ...]
    label: str


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def _mentions(question: str, phrase: str) -> bool:
    """`phrase` occurs in the question as the start of a word (`count` in `counting`)."""
    return re.search(rf"\b{re.escape(phrase)}", question) is not None


# -- reading the instruction ------------------------------------------------------------------


def read_spec(instruction: str) -> AnswerSpec | None:
    """The answer the instruction asks for; None when it is not a data-analysis task."""
    if "pytest" in instruction:
        return None
    outputs = [normalize_path(p) for p in _WRITE.findall(instruction)]
    outputs = [p for p in outputs if p.endswith((".csv", ".json"))]
    quoted = [normalize_path(q) for q in backticked(instruction)]
    data = [q for q in quoted if q.endswith(DATA_EXTENSIONS) and q not in outputs and " " not in q]
    commands = [q for q in quoted if _RUN_SCRIPT.match(q)]
    if not outputs or not data or not commands:
        return None
    run_command = commands[0]
    match = _RUN_SCRIPT.match(run_command)
    assert match is not None
    output = outputs[0]
    parts = paragraphs(instruction)
    asked = [p for p in parts if "?" in p] or [p for p in parts if f"`{output}`" in p][:1]
    question = "\n".join(asked)
    shape, key = "table", ""
    columns: tuple[str, ...] = ()
    if output.endswith(".json"):
        templates = [t for t in backticked(question) if _JSON_TEMPLATE.match(t)]
        if not templates:
            return None
        template = _JSON_TEMPLATE.match(templates[0])
        assert template is not None
        key = template.group(1)
        shape = "list" if template.group(2).startswith("[") else "scalar"
    else:
        sentence = next((s for s in re.split(r"(?<=[.?])\s+", question) if output in s), "")
        after = sentence.split("columns", 1)[1] if "columns" in sentence else ""
        columns = tuple(c for c in backticked(after) if _IDENTIFIER.match(c))
        if len(columns) != 2:
            return None
        key = columns[0]
    return AnswerSpec(
        data_file=data[0],
        script=normalize_path(match.group(1)),
        run_command=run_command,
        output=output,
        shape=shape,
        columns=columns,
        key=key,
        question=question.lower(),
    )


def applies(instruction: str) -> bool:
    return read_spec(instruction) is not None


def profile_command(spec: AnswerSpec) -> str:
    script = PROFILE_SCRIPT.format(
        path=spec.data_file.replace("'", "''"), max_values=_MAX_VALUES_PROFILED
    )
    return f"python - <<'PROFILE'\n{script}PROFILE"


def check_command(spec: AnswerSpec) -> str:
    """Run the instruction's command, then show the answer and fail when it is missing or empty."""
    check = ANSWER_CHECK.format(output=spec.output)
    return f"{spec.run_command} && python - <<'CHECK'\n{check}CHECK"


def parse_profile(text: str) -> list[Column]:
    columns = []
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) != 7 or fields[0] != "column" or not fields[3].isdigit():
            continue
        _, name, kind, distinct, low, high, values = fields
        columns.append(
            Column(name, kind, int(distinct), low, high, tuple(v for v in values.split("|") if v))
        )
    return columns


# -- the grammar ------------------------------------------------------------------------------


def _singular(word: str) -> set[str]:
    forms = {word}
    if word.endswith("ies"):
        forms.add(word[:-3] + "y")
    if word.endswith("es"):
        forms.add(word[:-2])
    if word.endswith("s"):
        forms.add(word[:-1])
    return forms


def _groupings(spec: AnswerSpec, columns: list[Column]) -> list[Grouping]:
    """The answer's key as a grouping; every plausible one when the key names none."""
    if spec.shape == "scalar":
        return [Grouping("", "", True, False)]
    dates = [c for c in columns if c.date_like]
    derived: dict[str, str] = {}
    if dates:
        date = _quote(dates[0].name)
        derived = {
            "month": f"strftime(CAST({date} AS DATE), '%Y-%m')",
            "year": f"year(CAST({date} AS DATE))",
        }
    categorical = [c for c in columns if c.values and not c.numeric and not c.date_like]
    key_forms = _singular(spec.key.lower())
    for column in categorical:
        if column.name.lower() in key_forms:
            return [Grouping(_quote(column.name), column.name, True, False)]
    for name, sql in derived.items():
        if name in key_forms:
            return [Grouping(sql, name, True, True)]
    return [Grouping(_quote(c.name), c.name, False, False) for c in categorical] + [
        Grouping(sql, name, False, True) for name, sql in derived.items()
    ]


def _measure_named(question: str, columns: tuple[str, ...]) -> bool:
    words = _words(question)
    for column in columns:
        lowered = column.lower()
        if f"`{lowered}`" in question or lowered in words:
            continue
        synonyms = [w for key, ws in MEASURE_WORDS.items() if key in lowered for w in ws]
        if not any(s in words for s in synonyms):
            return False
    return True


def _measures(spec: AnswerSpec, columns: list[Column]) -> list[Measure]:
    numeric = [c.name for c in columns if c.numeric and not c.id_like]
    named = [n for n in numeric if _measure_named(spec.question, (n,))]
    chosen = named or numeric
    measures = [Measure(_quote(n), (n,), n) for n in chosen]
    measures += [
        Measure(f"{_quote(a)} * {_quote(b)}", (a, b), f"{a}*{b}")
        for a, b in itertools.combinations(chosen, 2)
    ]
    return measures


def _product_stated(question: str, measure: Measure) -> bool:
    if len(measure.columns) != 2:
        return False
    a, b = (re.escape(c.lower()) for c in measure.columns)
    times = r"`?\s*(?:x|\*|\u00d7|times)\s*`?"
    if re.search(rf"\b{a}\b{times}\b{b}\b|\b{b}\b{times}\b{a}\b", question):
        return True
    return any(w in _words(question) for w in PRODUCT_WORDS) and _measure_named(
        question, measure.columns
    )


def _negated_before(question: str, position: int) -> bool:
    sentence_start = max(question.rfind(".", 0, position), question.rfind("?", 0, position))
    before = question[sentence_start + 1 : position].lower().split()[-4:]
    text = " ".join(before)
    return any(re.search(rf"\b{word}\b", text) for word in _NEGATIONS)


def _conditions(spec: AnswerSpec, columns: list[Column]) -> list[Condition]:
    conditions: list[Condition] = []
    seen: set[tuple[str, str]] = set()
    question = spec.question
    for match in re.finditer(r"`([^`\n]+)`", question):
        value = match.group(1)
        for column in columns:
            if column.numeric or column.date_like:
                continue
            if value.lower() in (v.lower() for v in column.values):
                actual = next(v for v in column.values if v.lower() == value.lower())
                literal = "'" + actual.replace("'", "''") + "'"
                if (column.name, literal) not in seen:
                    seen.add((column.name, literal))
                    negated = _negated_before(question, match.start())
                    conditions.append(Condition(_quote(column.name), literal, negated))
    dates = [c for c in columns if c.date_like]
    if dates:
        first, last = int(dates[0].low[:4]), int(dates[0].high[:4])
        left = f"year(CAST({_quote(dates[0].name)} AS DATE))"
        for match in _YEAR.finditer(question):
            year = int(match.group(1))
            if first <= year <= last and (left, str(year)) not in seen:
                seen.add((left, str(year)))
                conditions.append(
                    Condition(left, str(year), _negated_before(question, match.start()))
                )
    return conditions[:_MAX_CONDITIONS]


def _limits(spec: AnswerSpec) -> list[int | None]:
    if spec.shape != "list":
        return [None]
    numbers = []
    for match in _SMALL_NUMBER.finditer(spec.question):
        number = int(match.group(1))
        if number > 0 and number not in numbers:
            numbers.append(number)
    return list(numbers) or [None]


def _aggregations(question: str) -> tuple[list[str], set[str]]:
    cued = {
        a for a, words in AGGREGATION_WORDS.items() if any(_mentions(question, w) for w in words)
    }
    chosen = [a for a in AGGREGATIONS if a in cued or a == "count" or (a == "sum" and not cued)]
    return chosen, cued


@dataclasses.dataclass(frozen=True, slots=True)
class Script:
    """One candidate analysis: the query, the script that runs it, and what describes it."""

    label: str
    source: str
    features: dict[str, float]


def candidate_scripts(spec: AnswerSpec, columns: list[Column]) -> Iterator[Script]:
    """Every script of the grammar for this question, in a fixed order."""
    aggregations, cued = _aggregations(spec.question)
    measures = _measures(spec, columns)
    conditions = _conditions(spec, columns)
    for grouping, aggregation, limit in itertools.product(
        _groupings(spec, columns), aggregations, _limits(spec)
    ):
        for measure in [None] if aggregation == "count" else measures:
            for ops in itertools.product((None, "=", "<>"), repeat=len(conditions)):
                used = [(c, op) for c, op in zip(conditions, ops, strict=True) if op is not None]
                yield _script(spec, grouping, aggregation, cued, measure, used, conditions, limit)


def _script(
    spec: AnswerSpec,
    grouping: Grouping,
    aggregation: str,
    cued: set[str],
    measure: Measure | None,
    used: list[tuple[Condition, str]],
    conditions: list[Condition],
    limit: int | None,
) -> Script:
    function = {"mean": "avg"}.get(aggregation, aggregation)
    value = "count(*)" if measure is None else f"{function}({measure.sql})"
    where = " AND ".join(f"{c.left} {op} {c.value}" for c, op in used)
    where_sql = f" WHERE {where}" if where else ""
    if spec.shape == "scalar":
        query = f"SELECT {value} FROM data{where_sql}"
        writer = _SCALAR_WRITER.format(output=spec.output, key=spec.key)
    elif spec.shape == "list":
        cut = f" LIMIT {limit}" if limit is not None else ""
        query = (
            f"SELECT {grouping.sql} FROM data{where_sql} GROUP BY 1 ORDER BY {value} DESC, 1{cut}"
        )
        writer = _LIST_WRITER.format(output=spec.output, key=spec.key)
    else:
        query = f"SELECT {grouping.sql}, {value} FROM data{where_sql} GROUP BY 1 ORDER BY 1"
        writer = _TABLE_WRITER.format(output=spec.output, columns=list(spec.columns))
    measured = "*" if measure is None else measure.label
    label = f"{aggregation}({measured})"
    if grouping.name:
        label += f" by {grouping.name}"
    if where:
        label += f" where {where}"
    if limit is not None:
        label += f" top {limit}"
    source = SCRIPT.format(
        title=f"Answer: {label}.", data_file=spec.data_file, query=query, writer=writer
    )
    agree = [(c.negated and op == "<>") or (not c.negated and op == "=") for c, op in used]
    features = {
        "data_is_script": 1.0,
        f"data_agg_{aggregation}": 1.0,
        "data_agg_cued": float(aggregation in cued),
        "data_agg_other_cued": float(aggregation not in cued and bool(cued)),
        "data_measure_none": float(measure is None),
        "data_measure_column": float(measure is not None and len(measure.columns) == 1),
        "data_measure_product": float(measure is not None and len(measure.columns) == 2),
        "data_measure_named": float(
            measure is not None and _measure_named(spec.question, measure.columns)
        ),
        "data_measure_product_stated": float(
            measure is not None and _product_stated(spec.question, measure)
        ),
        "data_filter_none": float(not used),
        "data_filter_covers_quoted": float(bool(conditions) and len(used) == len(conditions)),
        "data_filter_partial": float(0 < len(used) < len(conditions)),
        "data_filter_agrees_with_negation": float(bool(used) and all(agree)),
        "data_filter_contradicts_negation": float(not all(agree)),
        "data_group_is_output_key": float(grouping.is_output_key and spec.shape != "scalar"),
        "data_group_derived": float(grouping.derived),
        f"data_shape_{spec.shape}": 1.0,
        "data_limit_from_question": float(limit is not None),
    }
    return Script(label, source, features)


# -- proposing --------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Situation:
    spec: AnswerSpec
    profile_command: str
    check_command: str
    columns: list[Column] | None = None
    """From the profile; None until the data was profiled ([] when profiling failed)."""
    script_text: str | None = None
    answered: bool = False
    """A script trial was kept: it ran and wrote a non-empty answer."""
    failed_scripts: int = 0
    tried: frozenset[str] = frozenset()


def _read_situation(spec: AnswerSpec, history: History) -> _Situation:
    situation = _Situation(spec, profile_command(spec), check_command(spec))
    for turn in history.turns:
        if isinstance(turn.action, RunCommand) and turn.action.command == situation.profile_command:
            ok = turn.observation.exit_code == 0
            situation.columns = parse_profile(turn.observation.text) if ok else []
    edits = follow_edits(history)
    situation.script_text = edits.files.get(spec.script)
    situation.answered = edits.kept > 0
    situation.failed_scripts = edits.reverted
    situation.tried = frozenset(d for path, d in edits.tried if path == spec.script)
    return situation


def propose(history: History) -> list[Candidate]:
    """Every action worth considering after `history` on a data-analysis task, with features.

    Deterministic; never empty; once a script wrote an answer, submitting is all that is left."""
    spec = read_spec(history.instruction)
    if spec is None:
        return [Candidate(Submit(), feature_vector({"data_is_submit": 1.0}), "submit")]
    situation = _read_situation(spec, history)
    base = {
        "data_profiled": float(situation.columns is not None),
        "data_step_fraction": min(history.step_count / STEP_HORIZON, 1.0),
        "data_scripts_failed_scaled": min(situation.failed_scripts / 4.0, 1.0),
    }
    submit = Candidate(
        Submit(),
        feature_vector(
            {
                **base,
                "data_is_submit": 1.0,
                "data_submit_without_answer": float(not situation.answered),
            }
        ),
        "submit",
    )
    if situation.answered:
        return [submit]
    candidates = []
    if situation.columns is None:
        candidates.append(
            Candidate(
                RunCommand(situation.profile_command),
                feature_vector({**base, "data_is_profile": 1.0}),
                f"profile {spec.data_file}",
            )
        )
    if situation.script_text is None:
        candidates.append(
            Candidate(
                ReadFile(spec.script),
                feature_vector({**base, "data_is_read_script": 1.0}),
                f"read {spec.script}",
            )
        )
    current = situation.script_text
    if situation.columns and current is not None and current.strip():
        for script in candidate_scripts(spec, situation.columns):
            if script.source == current or digest(script.source) in situation.tried:
                continue  # a script that failed fails again: the proposer keeps track
            features = {**base, **script.features}
            action = TryEdit(spec.script, current, script.source, situation.check_command, 1)
            candidates.append(Candidate(action, feature_vector(features), f"try {script.label}"))
    if situation.tried or situation.failed_scripts:
        candidates.append(submit)
    return candidates or [submit]
