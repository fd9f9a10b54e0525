"""The audit's rollup: every (message, consumer group) pair classified and rolled up per window
(``rolled``), the one frame every output of ``spark/audit.py`` reads.

Most messages are settled by a fold of their lines (``pairing.message_pairs``); the others (lines
of several groups, orphans, lines on both sides of the deadline) take the exact path
(``pairing.pair_contributions``). Both end in one local checkpoint.
"""

from collections.abc import Callable
from contextlib import contextmanager

from pyspark import StorageLevel
from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from spark import evidence, log_facts, metrics, pairing, transforms

# Messages the exact path broadcasts to pick their lines out of the consumer logs; more are
# joined by a shuffle.
EXACT_BROADCAST_LIMIT = 1_000_000
# The rollup's shuffle partitions, by size: its rows are wide (the evidence's fields and some
# thirty counts) and compress about 30x in the shuffle, so Spark's default of 64 MB per
# partition gives a day with millions of evidence rows (a missing consumer log: every message
# of the group unverified) final-aggregate tasks that hold GBs and spill: 5M such rows took
# 13.7 s of task CPU in 3 tasks, 9.2 s in 8. Capped by ``spark.sql.shuffle.partitions``.
ROLLUP_PARTITION_BYTES = 8 << 20
# Above this share of possibly several-group lines (``LogFacts.multi_group_lines``) among the
# producer lines, the audit joins every message to its lines instead of folding them.
FOLD_MAX_MULTI_GROUP_SHARE = 0.2


def observed_spans(rolled: DataFrame) -> list[tuple]:
    """(exchange, routing_key, consumer_group, first window, last window) of the messages
    each group consumed of a key no binding or configuration names it for."""
    return [
        tuple(row)
        for row in rolled.where("unbound_consumption > 0")
        .groupBy("exchange", "unbound_routing_key", "consumer_group")
        .agg(F.min("window_ms"), F.max("window_ms"))
        .orderBy("exchange", "unbound_routing_key", "consumer_group")
        .collect()
    ]


def takes_fold(facts: log_facts.LogFacts, fold: bool | None = None) -> bool:
    """Whether the rollup takes the fold path. The fold settles the messages whose lines come
    from one group; when many messages may have lines from several (fanout bindings, unbound
    groups), every message takes the join (``FOLD_MAX_MULTI_GROUP_SHARE``). Both paths give
    the same outputs: the choice is one of cost, and ``fold`` (True or False) forces it, so
    that one day can be run through both and compared (tests/spark/test_audit_paths.py);
    None lets the day's facts choose, as the nightly audit does."""
    if fold is not None:
        return fold
    return facts.multi_group_lines <= FOLD_MAX_MULTI_GROUP_SHARE * facts.producer_lines


def messages_of(
    facts: log_facts.LogFacts,
    producer_raw: DataFrame,
    consumer_raw: DataFrame,
    bits: DataFrame,
    day_start_ms: int,
    fold: bool,
) -> tuple[DataFrame, DataFrame | None]:
    """(messages, consumers): each message's lines folded (``per_message``) with the groups it
    is expected to reach, and, for the exact path only, the consumer lines that built it,
    grouped per message and group and shuffled on their own (``by_message``), for
    ``pairing.pair_contributions`` to read the same shuffle. When ``fold``, whole lines are
    shuffled together with the producer's and nothing else reads them: consumers is None."""
    expected = log_facts.local_frame(
        producer_raw.sparkSession, facts.expectations, facts.expectation_columns()
    )
    producers = transforms.keyed_producer_lines(transforms.valid_lines(producer_raw), day_start_ms)
    valid_consumer_lines = transforms.valid_lines(consumer_raw)
    if fold:  # one shuffle of both logs' lines; nothing else reads the consumers'
        consumers = transforms.message_lines(valid_consumer_lines, bits)
    else:
        producers = transforms.by_message(producers)
        consumers = transforms.by_message(
            transforms.grouped_consumer_lines(valid_consumer_lines, bits)
        )
    messages = transforms.with_expected(
        transforms.per_message(producers, consumers, facts.words, shuffled=not fold),
        expected,
        facts.words,
    )
    return messages, None if fold else consumers


def rolled(
    facts: log_facts.LogFacts,
    producer_raw: DataFrame,
    consumer_raw: DataFrame,
    store: DataFrame,
    day_start_ms: int,
    grace_ms: int,
    now_ms: int,
    unbound_evidence: bool = True,
    fold: bool | None = None,
) -> tuple[DataFrame, dict[str, int]]:
    """One job shuffles the lines by message_id, folds them per message, builds the pairs of
    the messages the fold settles and stores their ``metrics.rollup`` as a local checkpoint,
    with a row for each message it does not settle; if there are any, a second job builds
    their pairs the exact way (``pairing.pair_contributions``) and checkpoints both rollups
    together. Every output reads that checkpoint. The checkpoint cuts the lineage: each output
    is planned over a one-node plan instead of the whole audit's (analysis, cache lookups and
    optimisation of that plan cost seconds per output). Its blocks go with the frames.
    ``unbound_evidence``: as ``metrics.rollup``'s. ``fold``: the path (``takes_fold``); None
    lets the day choose. Returns the checkpoint and, counted while it was written, the rows
    each evidence output lists (``evidence.listed_counts``).
    """
    spark = producer_raw.sparkSession
    keys = log_facts.local_frame(spark, facts.keys, log_facts.KEY_COLUMNS)
    # Each group's bit and hash, looked up by the join that gives every consumer line its bit.
    bits = log_facts.local_frame(
        spark,
        [(g, i) for i, g in enumerate(facts.bit_groups)],
        [("consumer_group", "string"), ("bit", "int")],
    ).select("consumer_group", "bit", log_facts.group_hash().alias("bit_group_hash"))
    fold = takes_fold(facts, fold)
    messages, consumers = messages_of(facts, producer_raw, consumer_raw, bits, day_start_ms, fold)
    # Only span facts say "received, outcome unknown" (a failed span: spark/spans.py); a day of
    # logs alone plans the store's rows as it always did.
    received = (
        transforms.received_unknown_rows(transforms.valid_lines(consumer_raw))
        if "source" in consumer_raw.columns
        else None
    )
    stored = transforms.store_rows(
        store,
        log_facts.local_frame(
            spark, facts.queue_groups, [("queue", "string"), ("consumer_group", "string")]
        ),
        received,
    )
    # The pairs carry a group's hash; the rolled rows get its name back.
    group_names = log_facts.local_frame(
        spark, [(g,) for g in facts.groups], [("consumer_group", "string")]
    ).select(log_facts.group_hash().alias("group_hash"), "consumer_group")
    gap_windows = log_facts.local_frame(
        spark, facts.gap_windows, [("window_ms", "bigint"), ("consumer_group", "string")]
    )

    def rolled_up(pairs: DataFrame, carry: tuple[str, ...] = ()) -> DataFrame:
        classified = transforms.with_key_names(
            transforms.classify_pairs(transforms.with_store(pairs, stored), carry), keys
        )
        return (
            transforms.mark_gaps(
                metrics.rollup(classified, grace_ms, now_ms, carry, unbound_evidence), gap_windows
            )
            .join(F.broadcast(group_names), on="group_hash", how="left")
            .drop("group_hash")
        )

    if fold:
        return _folded_rollup(
            messages, consumer_raw, bits, rolled_up, day_start_ms, grace_ms, facts.bit_groups
        )
    pairs = pairing.pairs(
        pairing.pair_contributions(
            messages.select(*pairing.exact_facts(messages)),
            consumers,
            day_start_ms,
            grace_ms,
            facts.bit_groups,
        )
    )
    return _checkpoint(rolled_up(pairs), evidence.listed_counts(), one_partition=True)


def _folded_rollup(
    messages: DataFrame,
    consumer_raw: DataFrame,
    bits: DataFrame,
    rolled_up: Callable[..., DataFrame],
    day_start_ms: int,
    grace_ms: int,
    bit_groups: list[str],
) -> tuple[DataFrame, dict[str, int]]:
    """The rollup of ``pairing.message_pairs``, plus that of the exact path's pairs for the
    messages the fold left (their lines picked out of the consumer logs again), checkpointed;
    with the counts of ``evidence.listed_counts``."""
    # Kept in the rollup's partitions: the messages left for the exact path have a row each,
    # and they could be many. They are counted while the checkpoint is written.
    first_pass, counts = _checkpoint(
        rolled_up(pairing.message_pairs(messages, day_start_ms, grace_ms, bit_groups), ("exact",)),
        {
            "exact_messages": "count_if(exact IS NOT NULL)",
            **evidence.listed_counts("exact IS NULL"),
        },
    )
    settled = first_pass.where("exact IS NULL").drop("exact")
    exact = first_pass.where("exact IS NOT NULL").select("exact.*")
    exact_messages = counts.pop("exact_messages")
    if not exact_messages:
        # one partition, as _checkpoint's, without a second copy
        return settled.coalesce(1), counts
    # The exact path: the messages the first pass could not fold, with their lines.
    ids = exact.select("message_id")
    lines = transforms.valid_lines(consumer_raw).join(
        F.broadcast(ids) if exact_messages <= EXACT_BROADCAST_LIMIT else ids,
        on="message_id",
        how="left_semi",
    )
    pairs = pairing.pairs(
        pairing.pair_contributions(
            exact,
            transforms.by_message(transforms.grouped_consumer_lines(lines, bits)),
            day_start_ms,
            grace_ms,
            bit_groups,
        )
    )
    return _checkpoint(
        settled.unionByName(rolled_up(pairs)), evidence.listed_counts(), one_partition=True
    )


def _checkpoint(
    frame: DataFrame, counts: dict[str, str], one_partition: bool = False
) -> tuple[DataFrame, dict[str, int]]:
    """``frame`` computed here, eagerly, once; the checkpoint cuts its lineage. Returned with
    ``counts`` (name -> SQL aggregate), observed while it is written: metrics of its job, not a
    job reading it again. The final rollup goes in one partition: it is small, and a single
    partition satisfies every grouping and join of the outputs, so each output is one stage
    instead of a chain of shuffles."""
    seen = Observation("checkpoint")
    frame = frame.observe(seen, *[F.expr(f"{sql} AS {name}") for name, sql in counts.items()])
    if one_partition:
        frame = frame.repartition(1)
    with _advisory_partition_bytes(frame.sparkSession, ROLLUP_PARTITION_BYTES):
        checkpoint = frame.localCheckpoint(eager=True, storageLevel=StorageLevel.MEMORY_AND_DISK)
    return checkpoint, dict(seen.get)


@contextmanager
def _advisory_partition_bytes(spark, size: int):
    """Adaptive execution's target partition size set to ``size`` while the block runs (an
    eager checkpoint: the one job it plans), then restored. The main pass's own shuffle has a
    fixed count (``transforms.by_message``): this reaches the rollup's."""
    key = "spark.sql.adaptive.advisoryPartitionSizeInBytes"
    before = spark.conf.get(key, None)
    spark.conf.set(key, str(size))
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
