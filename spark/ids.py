"""Small integer ids for consumer groups, exchanges and routing keys, numbered on the driver.

The per-message aggregates run as code-generated hash aggregates only when every aggregation
buffer is fixed-width, and strings are not. Groups and (exchange, routing key) pairs are few
(they come from the logs' summaries), so the job numbers them here: the pairs carry the numbers,
a set of groups is a bitmask of ``words`` longs, and the outputs turn numbers back into names.
"""

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

WORD_BITS = 64


@dataclass(frozen=True)
class Ids:
    groups: DataFrame  # consumer_group, gid (in name order)
    exchanges: DataFrame  # exchange_id, exchange
    # key_id, exchange, routing_key, exchange_id, expected_gids (sorted), expected_words (bitmask)
    keys: DataFrame
    words: int


def _signed(word: int) -> int:
    return word - (1 << WORD_BITS) if word >= 1 << (WORD_BITS - 1) else word


def bitmask(gids: list[int], words: int) -> list[int]:
    mask = [0] * words
    for gid in gids:
        mask[gid // WORD_BITS] |= 1 << (gid % WORD_BITS)
    return [_signed(word) for word in mask]


def number_ids(spark: SparkSession, group_names, expected_keys) -> Ids:
    """``group_names``: every consumer group; ``expected_keys``: rows (exchange, routing_key,
    expected_groups) for every published key (``expected_groups`` null when none is bound)."""
    names = sorted({*group_names, *(g for k in expected_keys for g in k.expected_groups or ())})
    gid = {name: i for i, name in enumerate(names)}
    words = max(1, -(-len(names) // WORD_BITS))
    exchange_names = sorted({k.exchange for k in expected_keys})
    exchange_id = {name: i for i, name in enumerate(exchange_names)}
    keys = []
    for key_id, k in enumerate(sorted(expected_keys, key=lambda k: (k.exchange, k.routing_key))):
        gids = sorted(gid[g] for g in k.expected_groups or ())
        keys.append(
            (key_id, k.exchange, k.routing_key, exchange_id[k.exchange], gids, bitmask(gids, words))
        )
    return Ids(
        groups=spark.createDataFrame(list(gid.items()), "consumer_group string, gid int"),
        exchanges=spark.createDataFrame(
            [(i, name) for name, i in exchange_id.items()], "exchange_id int, exchange string"
        ),
        keys=spark.createDataFrame(
            keys,
            "key_id int, exchange string, routing_key string, exchange_id int, "
            "expected_gids array<int>, expected_words array<bigint>",
        ),
        words=words,
    )
