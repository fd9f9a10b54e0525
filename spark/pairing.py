"""From each message's facts to its pairs (message x consumer group): the fast path, where a
message's one row is its pairs (``message_pairs``), and the exact path for the rest: each consumer
line joined to its message's facts as what it adds to its pair (``pair_contributions``), summed
into pairs (``pairs``). The definitions are the docstring of ``spark/transforms.py``; the
per-message facts come from there (``per_message``, ``with_expected``)."""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark.expectations import WORD_BITS
from spark.log_facts import sql_literal
from spark.schema import HOUR_MS

# What one consumer line (or one silent expected group) adds to its pair.
CONTRIBUTION_TYPE = T.StructType(
    [
        T.StructField("group_hash", T.LongType()),
        T.StructField("deliveries", T.IntegerType()),
        T.StructField("redelivered", T.IntegerType()),
        T.StructField("late", T.IntegerType()),
        T.StructField("consuming_ts", T.LongType()),
        T.StructField("primary", T.BooleanType()),
        T.StructField("expected", T.BooleanType()),
        T.StructField("orphan_consumer", T.StringType()),
        T.StructField("orphan_ts", T.LongType()),
        T.StructField("unbound", T.BooleanType()),
    ]
)


def _contribution(
    group: str,
    primary: str,
    expected: str,
    deliveries: str = "0",
    redelivered: str = "0",
    late: str = "0",
    consuming_ts: str = "NULL",
    orphan_consumer: str = "NULL",
    orphan_ts: str = "NULL",
    unbound: str = "false",
) -> str:
    """SQL: a ``CONTRIBUTION_TYPE`` struct from SQL expressions for its fields."""
    values = (
        group,
        deliveries,
        redelivered,
        late,
        consuming_ts,
        primary,
        expected,
        orphan_consumer,
        orphan_ts,
        unbound,
    )
    fields = ", ".join(
        f"'{f.name}', CAST({v} AS {f.dataType.simpleString()})"
        for v, f in zip(values, CONTRIBUTION_TYPE.fields, strict=True)
    )
    return f"named_struct({fields})"


class _Bits:
    """SQL over the bound groups' bitmasks: ``expected_w`` (the first attempt's key) and
    ``seen_w`` (the groups that logged a line), ``WORD_BITS`` bits per word."""

    def __init__(self, words: int):
        self.words = range(words)

    def _word(self, column: str, bit: str) -> str:
        if len(self.words) == 1:
            return f"{column}_0"
        cases = " ".join(f"WHEN {w} THEN {column}_{w}" for w in self.words)
        return f"CASE CAST(floor({bit} / {WORD_BITS}) AS int) {cases} END"

    def mask(self, bit: str) -> str:
        return f"shiftleft(1L, pmod({bit}, {WORD_BITS}))"

    def expected(self, bit: str) -> str:
        return f"coalesce(({self._word('expected', bit)} & {self.mask(bit)}) != 0, false)"

    def unbound(self, bit: str) -> str:
        """Whether no binding or configuration names the group of ``bit`` for the key."""
        return f"coalesce(({self._word('bound', bit)} & {self.mask(bit)}) = 0, true)"

    def unseen(self, bit: str) -> str:
        return f"({self._word('seen', bit)} & {self.mask(bit)}) = 0"

    def any_expected(self) -> str:
        return " OR ".join(f"expected_{w} != 0" for w in self.words)

    def any_silent(self) -> str:
        return " OR ".join(f"(expected_{w} & ~seen_{w}) != 0" for w in self.words)

    def is_first_expected(self, bit: str) -> str:
        """Whether ``bit`` is the lowest expected bit: the first expected group by name."""
        cases = " ".join(
            f"WHEN expected_{w} != 0 THEN CAST(floor({bit} / {WORD_BITS}) AS int) = {w} "
            f"AND {self.mask(bit)} = (expected_{w} & -expected_{w})"
            for w in self.words
        )
        return f"coalesce(CASE {cases} END, false)"


def _silent_bits(bits: _Bits, bit_groups: list[str], empty: str) -> str:
    """SQL: the bits of the expected groups that logged no line (an array of int); ``empty``
    when there are no groups at all."""
    if not bit_groups:
        return empty
    return (
        f"filter(sequence(0, {len(bit_groups) - 1}), "
        f"i -> {bits.expected('i')} AND {bits.unseen('i')})"
    )


def _silent_groups(bits: _Bits, bit_groups: list[str], one, empty: str) -> str:
    """SQL: ``one(<the group's hash>)`` (an expression of the bit ``i``) for each expected group
    that logged no line; ``empty`` when there are no groups at all."""
    if not bit_groups:
        return empty
    names = sql_literal(bit_groups, "array<string>")
    silent_bits = _silent_bits(bits, bit_groups, empty)
    return f"transform({silent_bits}, i -> {one(f'xxhash64(element_at({names}, i + 1))')})"


def _per_group_cases(
    bits: _Bits, has_line: str, line: str, silent: str, nobody: str, empty: str
) -> str:
    """SQL, the cases of a CASE after its ``CASE``: the row's own ``line`` (when ``has_line``),
    the silent expected groups, and ``nobody`` for a message with neither lines nor expected
    groups. The common case (a line, no silent group) is a one-element array, no concat."""
    return (
        f"WHEN {has_line} AND NOT ({bits.any_silent()}) THEN array({line}) "
        f"ELSE concat(CASE WHEN {has_line} THEN array({line}) ELSE {empty} END, "
        f"CASE WHEN {bits.any_silent()} THEN {silent} ELSE {empty} END, "
        f"CASE WHEN line_count = 0 AND NOT ({bits.any_expected()}) THEN array({nobody}) "
        f"ELSE {empty} END) END"
    )


def pair_contributions(
    messages: DataFrame,
    consumers: DataFrame,
    day_start_ms: int,
    grace_ms: int,
    bit_groups: list[str],
) -> DataFrame:
    """Each consumer line joined to its message, as what it adds to its pair; plus a zero
    contribution for every expected group that logged no line (silent), and one for the null
    group of a message with neither lines nor expected groups. Orphan lines of the day (a
    message_id no producer line has) carry ``orphan_consumer``/``orphan_ts``.

    ``messages``: ``EXACT_FACTS``, ``seen_w`` and ``expected_w`` per message (the ``exact``
    column of ``message_pairs``); ``consumers``: their ``grouped_consumer_lines``, ``by_message``.
    ``bit_groups``: the names of the bits. The expressions are SQL text: one round trip to the
    JVM each, not one per operator.
    """
    joined = messages.join(consumers.hint("shuffle_hash"), on="message_id", how="left").select(
        "*", "line.*"
    )
    bits = _Bits(max(1, -(-len(bit_groups) // WORD_BITS)))
    day_end_ms = day_start_ms + 24 * HOUR_MS
    orphan = "first_ts IS NULL"
    on_time = f"(NOT {orphan} AND ts IS NOT NULL AND ts < window_ms + {HOUR_MS + grace_ms})"
    line = _contribution(
        "group_hash",
        f"CASE WHEN {bits.any_expected()} THEN {bits.is_first_expected('bit')} "
        "ELSE group_hash = min_group_hash END",
        bits.expected("bit"),
        deliveries=f"CASE WHEN {on_time} THEN 1 ELSE 0 END",
        redelivered=f"CASE WHEN {on_time} AND redelivered THEN 1 ELSE 0 END",
        late=f"CASE WHEN NOT {orphan} AND ts IS NOT NULL AND NOT {on_time} THEN 1 ELSE 0 END",
        consuming_ts=f"CASE WHEN {on_time} AND consuming THEN ts END",
        orphan_consumer=f"CASE WHEN {orphan} THEN consumer END",
        orphan_ts=f"CASE WHEN {orphan} THEN ts END",
        unbound=f"NOT {orphan} AND {bits.unbound('bit')}",
    )
    none = f"CAST(array() AS {T.ArrayType(CONTRIBUTION_TYPE).simpleString()})"
    silent = _silent_groups(
        bits,
        bit_groups,
        lambda name: _contribution(name, bits.is_first_expected("i"), "true"),
        none,
    )
    nobody = _contribution("NULL", "true", "false")
    # Most rows are one line of a message whose expected groups all logged: one contribution.
    contributions = "CASE " + _per_group_cases(bits, "ts IS NOT NULL", line, silent, nobody, none)
    message = ["message_id", "first_ts", "window_ms", "key_hash", "attempts", "state"]
    in_day = f"window_ms >= {day_start_ms} AND window_ms < {day_end_ms}"
    line_in_day = f"ts >= {day_start_ms} AND ts < {day_end_ms}"
    window = f"CASE WHEN {orphan} THEN ts - pmod(ts, {HOUR_MS}) ELSE window_ms END AS window_ms"
    return (
        joined.where(f"({in_day}) OR ({orphan} AND {line_in_day})")
        .selectExpr(*message[:2], window, *message[3:], f"explode({contributions}) AS c")
        .select(*message, "c.*")
    )


# What pair_contributions needs of a message: the facts the exact path carries (``message_pairs``).
EXACT_FACTS = (
    "message_id",
    "first_ts",
    "key_hash",
    "attempts",
    "state",
    "min_group_hash",
    "line_count",
    "window_ms",
)
PAIR_FIELDS = (
    ("group_hash", "bigint"),
    ("primary", "boolean"),
    ("expected", "boolean"),
    ("deliveries", "bigint"),
    ("redelivered", "bigint"),
    ("late_deliveries", "bigint"),
    ("first_consumed_ts", "bigint"),
    ("last_consumed_ts", "bigint"),
    ("lines", "bigint"),
    ("unbound", "boolean"),
)


def exact_facts(messages: DataFrame) -> list[str]:
    """The columns of ``messages`` that ``pair_contributions`` reads."""
    bits = [c for c in messages.columns if c.startswith(("seen_", "expected_", "bound_"))]
    return [*EXACT_FACTS, *bits]


# What a row of ``message_pairs`` is, by the index its message's array gives it: the pair of
# the group that logged its lines, the null group of a message nobody was expected to receive
# and nobody logged, the one row of a message the fold leaves to the exact path; an index >= 0
# is the silent expected group of that bit.
LOGGED, NOBODY, UNFOLDED = -1, -2, -3


def _pair_fields(logged: dict[str, str], silent: dict[str, str], nobody: dict[str, str]) -> list:
    """SQL: each of ``PAIR_FIELDS`` as a column of the row's ``pair`` index: the ``logged``,
    ``silent`` (of bit ``pair``) or ``nobody`` expression for it; null when absent and on the
    unfolded rows."""

    def field(name: str, sql_type: str) -> str:
        cases = [
            (f"pair = {LOGGED}", logged.get(name)),
            ("pair >= 0", silent.get(name)),
            (f"pair = {NOBODY}", nobody.get(name)),
        ]
        whens = " ".join(f"WHEN {when} THEN {value}" for when, value in cases if value)
        return (
            f"CAST(CASE {whens} END AS {sql_type}) AS {name}"
            if whens
            else (f"CAST(NULL AS {sql_type}) AS {name}")
        )

    return [field(name, sql_type) for name, sql_type in PAIR_FIELDS]


def message_pairs(
    messages: DataFrame, day_start_ms: int, grace_ms: int, bit_groups: list[str]
) -> DataFrame:
    """``pairs`` straight from ``per_message``, for the messages it folded exactly: logged by a
    producer, with lines from one group only, all of them on time or all late. Each of the
    other messages of the day (orphan lines, lines of several groups, lines on both sides of
    the deadline) is one row with the facts the exact path needs in ``exact``
    (``EXACT_FACTS``, ``seen_w``, ``expected_w``) and null pair fields; the rows of the others
    have a null ``exact``.

    A message's rows are the explode of an array of small integers (``LOGGED``, ``NOBODY``,
    ``UNFOLDED`` or a silent group's bit), most often one; each pair field is then an
    expression of that index (no array of structs per message to build and take apart).

    ``messages``: ``with_expected(per_message(...))``; ``bit_groups``: the names of the bits.
    """
    words = len([c for c in messages.columns if c.startswith("expected_")])
    bits = _Bits(words)
    day_end_ms = day_start_ms + 24 * HOUR_MS
    deadline = f"window_ms + {HOUR_MS + grace_ms}"
    on_time = f"last_line_ts < {deadline}"
    folded = (
        f"first_ts IS NOT NULL AND (line_count = 0 OR (min_group_hash = max_group_hash "
        f"AND ({on_time} OR first_line_ts >= {deadline})))"
    )
    in_day = f"window_ms >= {day_start_ms} AND window_ms < {day_end_ms}"
    # Orphan lines count only in the day; a message with none there has nothing to check.
    orphan = f"first_ts IS NULL AND first_line_ts < {day_end_ms} AND last_line_ts >= {day_start_ms}"
    logged = {
        "group_hash": "min_group_hash",
        "primary": f"CASE WHEN {bits.any_expected()} THEN {bits.is_first_expected('bit')} "
        "ELSE true END",
        "expected": bits.expected("bit"),
        "deliveries": f"CASE WHEN {on_time} THEN line_count ELSE 0 END",
        "redelivered": f"CASE WHEN {on_time} THEN redelivered ELSE 0 END",
        "late_deliveries": f"CASE WHEN {on_time} THEN 0 ELSE line_count END",
        "first_consumed_ts": f"CASE WHEN {on_time} THEN first_consumed_ts END",
        "last_consumed_ts": f"CASE WHEN {on_time} THEN last_consumed_ts END",
        "lines": "line_count",
        "unbound": bits.unbound("bit"),
    }
    # As many lines as the exact path's join rows: the message's lines, or its one row.
    silent = {
        "group_hash": f"xxhash64(element_at({sql_literal(bit_groups, 'array<string>')}, pair + 1))"
        if bit_groups
        else None,
        "primary": bits.is_first_expected("pair"),
        "expected": "true",
        "deliveries": "0",
        "redelivered": "0",
        "late_deliveries": "0",
        "lines": "greatest(line_count, 1)",
        "unbound": "false",
    }
    nobody = {
        "primary": "true",
        "expected": "false",
        "deliveries": "0",
        "redelivered": "0",
        "late_deliveries": "0",
        "lines": "1",
        "unbound": "false",
    }
    empty = "CAST(array() AS array<int>)"
    silent_bits = _silent_bits(bits, bit_groups, empty)
    indexes = (
        f"CASE WHEN NOT ({folded}) THEN array({UNFOLDED}) "
        f"WHEN line_count > 0 AND NOT ({bits.any_silent()}) THEN array({LOGGED}) "
        f"ELSE concat(CASE WHEN line_count > 0 THEN array({LOGGED}) ELSE {empty} END, "
        f"CASE WHEN {bits.any_silent()} THEN {silent_bits} ELSE {empty} END, "
        f"CASE WHEN line_count = 0 AND NOT ({bits.any_expected()}) THEN array({NOBODY}) "
        f"ELSE {empty} END) END"
    )
    exact = "named_struct(" + ", ".join(f"'{c}', {c}" for c in exact_facts(messages)) + ")"
    message = ["message_id", "first_ts", "window_ms", "key_hash", "attempts", "state"]
    fields = _pair_fields(logged, silent, nobody)
    return (
        messages.where(f"({folded} AND {in_day}) OR (NOT ({folded}) AND ({in_day} OR {orphan}))")
        .selectExpr(
            "*",
            f"explode({indexes}) AS pair",
            f"CASE WHEN NOT ({folded}) THEN {exact} END AS exact",
        )
        .selectExpr(
            "message_id",
            fields[0],
            "CAST(NULL AS string) AS orphan_consumer",
            "CAST(NULL AS bigint) AS orphan_ts",
            *message[1:],
            *fields[1:],
            "exact",
        )
    )


def pairs(contributions: DataFrame) -> DataFrame:
    """One row per (message, group), or per distinct orphan line (``lines`` = its copies).

    Keyed under message_id, so the aggregate runs on the shuffle's partitions."""
    return contributions.groupBy("message_id", "group_hash", "orphan_consumer", "orphan_ts").agg(
        *[F.first(c).alias(c) for c in ("first_ts", "window_ms", "key_hash", "attempts", "state")],
        F.max("primary").alias("primary"),
        F.max("expected").alias("expected"),
        F.sum("deliveries").alias("deliveries"),
        F.sum("redelivered").alias("redelivered"),
        F.sum("late").alias("late_deliveries"),
        F.min("consuming_ts").alias("first_consumed_ts"),
        F.max("consuming_ts").alias("last_consumed_ts"),
        F.count(F.lit(1)).alias("lines"),
        F.max("unbound").alias("unbound"),
    )
