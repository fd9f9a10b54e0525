"""Pure logic of the collector: rows from deliveries, x-death, groups, the prefetch window and
the error classification (the header codec's edge types: tests/broker/test_codec.py). No broker,
no database."""

import datetime

import pika
import pika.data
import pika.exceptions
import psycopg.errors
import pytest

from recovery.client.headers import UndecodableHeaders
from recovery.collector.consumer import Window
from recovery.collector.rows import (
    DEAD_LETTERS,
    PARKED,
    RETURNS,
    UNROUTED,
    delivery_to_row,
    failure_group,
    x_death_summary,
)
from recovery.collector.writer import Batch, refuses_row
from recovery.errors import UnstorableDelivery

T1 = datetime.datetime(2026, 11, 21, 10, 0, 0, tzinfo=datetime.UTC)
T2 = datetime.datetime(2026, 11, 21, 10, 5, 0, tzinfo=datetime.UTC)


def death(queue, reason, count, time, exchange=""):
    return {
        "count": count,
        "reason": reason,
        "queue": queue,
        "time": time,
        "exchange": exchange,
        "routing-keys": [queue],
    }


def row(source, headers=None, exchange="", routing_key="", body=b"b", **props):
    properties = pika.BasicProperties(headers=headers, **props)
    return delivery_to_row(
        "v", "recovery.q", exchange, routing_key, properties, body, source=source
    )


class TestXDeathSummary:
    def test_it_reads_the_most_recent_death_first_and_sums_the_counts(self):
        summary = x_death_summary([death("a", "rejected", 3, T2), death("b", "expired", 2, T1)])
        assert summary == {
            "queue": "a",
            "exchange": "",
            "routing_keys": ["a"],
            "reason": "rejected",
            "count": 5,
            "first_at": T1,
            "last_at": T2,
        }

    @pytest.mark.parametrize("forged", [None, [], "rejected", 42, [1, "x"], {"queue": "a"}])
    def test_it_ignores_what_is_not_a_list_of_tables(self, forged):
        assert x_death_summary(forged) is None

    def test_it_survives_entries_with_garbage_fields(self):
        summary = x_death_summary(
            [{"count": "lots", "queue": b"caf\xe9", "time": "noon", "routing-keys": "k"}]
        )
        assert summary["count"] == 1
        assert summary["queue"] == "caf\ufffd"
        assert summary["routing_keys"] == ["k"]
        assert summary["first_at"] is None and summary["reason"] == ""

    def test_a_negative_count_does_not_subtract(self):
        assert x_death_summary([death("a", "rejected", -5, T1)])["count"] == 0


class TestDeliveryToRow:
    def test_a_dead_letter_takes_queue_reason_and_times_from_x_death(self):
        r = row(DEAD_LETTERS, {"x-death": [death("orders", "expired", 1, T1)]})
        assert (r.kind, r.reason, r.source_queue, r.death_count) == (
            "dead_letter",
            "expired",
            "orders",
            1,
        )
        assert r.first_death_at == r.last_death_at == T1

    def test_a_death_without_queue_or_routing_key_is_still_a_row(self):
        # A forged x-death with an empty routing-keys list used to raise IndexError (quarantine).
        entry = {**death("", "rejected", 1, T1), "routing-keys": []}
        r = row(DEAD_LETTERS, {"x-death": [entry]})
        assert (r.reason, r.source_queue, r.routing_keys) == ("rejected", "", "[]")
        assert r.group_label.startswith("(default exchange) → ")

    def test_an_unknown_reason_is_stored_as_unknown(self):
        r = row(DEAD_LETTERS, {"x-death": [death("orders", "solar-flare", 1, T1)]})
        assert r.reason == "unknown"

    def test_an_unroutable_message_keeps_an_earlier_death_as_history(self):
        r = row(
            UNROUTED,
            {"x-death": [death("orders", "rejected", 2, T1)]},
            exchange="shop",
            routing_key="k",
        )
        assert (r.kind, r.reason, r.source_exchange, r.routing_keys) == (
            "unroutable",
            "no_route",
            "shop",
            '["k"]',
        )
        assert (r.source_queue, r.death_count, r.first_death_at) == ("", 2, T1)

    def test_a_redelivery_has_the_same_fingerprint_and_other_content_another(self):
        headers = {"x-death": [death("orders", "rejected", 1, T1)], "tenant": "a"}
        first = row(DEAD_LETTERS, {**headers, "x-delivery-count": 0}, message_id="m")
        again = row(DEAD_LETTERS, {**headers, "x-delivery-count": 3}, message_id="m")
        other_body = row(DEAD_LETTERS, headers, message_id="m", body=b"c")
        other_id = row(DEAD_LETTERS, headers, message_id="n")
        assert first.fingerprint == again.fingerprint
        assert '"x-delivery-count"' not in first.headers
        assert len({first.fingerprint, other_body.fingerprint, other_id.fingerprint}) == 3

    def test_the_same_content_in_another_vhost_is_another_message(self):
        properties = pika.BasicProperties(headers={"a": 1})
        one = delivery_to_row("v1", "q", "", "", properties, b"x", source=DEAD_LETTERS)
        two = delivery_to_row("v2", "q", "", "", properties, b"x", source=DEAD_LETTERS)
        assert one.fingerprint != two.fingerprint

    @pytest.mark.parametrize(
        ("replay_count", "status"), [(1, "pending"), (2, "pending"), (3, "poisoned")]
    )
    def test_a_message_back_from_its_third_replay_is_poisoned(self, replay_count, status):
        r = row(
            DEAD_LETTERS,
            {"x-recovery-origin": 7, "x-recovery-replay-count": replay_count},
        )
        assert (r.origin_id, r.replay_count, r.status) == (7, replay_count, status)

    @pytest.mark.parametrize("origin", [0, -1, 2**70, "abc", 1.5e30, None])
    def test_an_impossible_origin_is_no_link(self, origin):
        assert row(DEAD_LETTERS, {"x-recovery-origin": origin}).origin_id is None

    def test_text_columns_lose_nul_and_are_cut_to_their_size(self):
        r = row(DEAD_LETTERS, message_id="a\x00b" + "c" * 300, content_type="t/x\x00")
        assert r.message_id == "ab" + "c" * 253
        assert r.content_type == "t/x"

    def test_headers_too_deep_to_decode_cannot_be_a_row(self):
        properties = pika.BasicProperties(headers=UndecodableHeaders(b"\x01"))
        with pytest.raises(UnstorableDelivery, match="nested too deep"):
            delivery_to_row("v", "q", "", "", properties, b"", source=RETURNS)


class TestParked:
    """A message a recovery queue parked past a delivery limit is stored as the row it would
    have been in that queue: same fields, same fingerprint (a copy stored before is a duplicate)."""

    @staticmethod
    def delivery(queue, source, headers, exchange, routing_key):
        properties = pika.BasicProperties(headers=headers, message_id="p-1", delivery_mode=2)
        return delivery_to_row("v", queue, exchange, routing_key, properties, b"p", source=source)

    def parked(self, original_headers, from_queue, exchange, routing_key, first_death=True):
        ours = {
            **death(from_queue, "delivery_limit", 1, T2, exchange),
            "routing-keys": [routing_key],
        }
        headers = {
            **original_headers,
            "x-death": [ours, *original_headers.get("x-death", [])],
            "x-delivery-count": 3,
        }
        if first_death:  # the broker adds them when the message had not died before
            headers |= {
                "x-first-death-queue": from_queue,
                "x-first-death-reason": "delivery_limit",
                "x-first-death-exchange": exchange,
            }
        return self.delivery("recovery.parked", PARKED, headers, "recovery.parked", routing_key)

    def test_an_unroutable_message_keeps_its_exchange_and_routing_key(self):
        original = self.delivery("recovery.unrouted", UNROUTED, {"a": 1}, "shop", "k.1")
        parked = self.parked({"a": 1}, "recovery.unrouted", "shop", "k.1")
        assert parked == original
        assert (parked.kind, parked.source_exchange, parked.routing_keys) == (
            "unroutable",
            "shop",
            '["k.1"]',
        )

    def test_a_dead_letter_keeps_its_own_death_history(self):
        app_death = {
            "x-death": [death("orders", "rejected", 2, T1)],
            "x-first-death-queue": "orders",
        }
        original = self.delivery(
            "recovery.dead_letters", DEAD_LETTERS, app_death, "recovery.dlx", "orders"
        )
        parked = self.parked(app_death, "recovery.dead_letters", "recovery.dlx", "orders", False)
        assert parked == original
        assert (parked.source_queue, parked.death_count) == ("orders", 2)

    def test_a_parked_message_no_recovery_queue_parked_is_refused(self):
        with pytest.raises(UnstorableDelivery, match="parking queue"):
            self.delivery("recovery.parked", PARKED, {"a": 1}, "recovery.parked", "")


class TestFailureGroup:
    def test_numbers_and_later_lines_do_not_split_a_group(self):
        a = failure_group("q", "rejected", {"x-exception-message": "Order 12 failed\nat x:1"})
        b = failure_group("q", "rejected", {"x-exception-message": "Order 345 failed\nat y:2"})
        assert a == b
        assert a[1] == "q · rejected · Order # failed"

    def test_the_exception_type_splits_a_group(self):
        a = failure_group("q", "rejected", {"x-exception-type": "A"})
        b = failure_group("q", "rejected", {"x-exception-type": "B"})
        assert a[0] != b[0]


class TestWindow:
    def batch(self, *sizes):
        batch = Batch()
        for tag, size in enumerate(sizes, 1):
            batch.add(tag, size, reason="x")
        return batch

    def test_it_starts_at_what_the_budget_allows_for_the_biggest_body(self):
        assert Window(2000, 64 << 20, 64 << 20).size == 1
        assert Window(2000, 64 << 20, 1 << 20).size == 64
        assert Window(50, 64 << 20, 1024).size == 50

    def test_it_grows_fourfold_per_batch_of_small_bodies_up_to_the_maximum(self):
        window = Window(2000, 64 << 20, 64 << 20)
        sizes = []
        for _ in range(7):
            window.after_batch(self.batch(1024, 900))
            sizes.append(window.size)
        assert sizes == [4, 16, 64, 256, 1024, 2000, 2000]
        assert window.changed

    def test_a_big_body_shrinks_it_at_once(self):
        window = Window(2000, 64 << 20, 1024)
        window.changed = False
        window.saw(20 << 20)
        assert (window.size, window.changed) == (3, True)
        window.saw(10)
        assert window.size == 3  # small bodies grow it back batch by batch, not here


class TestRefusesRow:
    @pytest.mark.parametrize("code", ["22021", "22P05", "23502", "54000", "54001"])
    def test_data_and_limit_errors_are_about_the_row(self, code):
        assert refuses_row(psycopg.errors.lookup(code)())

    @pytest.mark.parametrize("code", ["08006", "57P01", "53100", "40P01", "42P01", "25P02"])
    def test_connection_resource_and_schema_errors_are_about_the_database(self, code):
        assert not refuses_row(psycopg.errors.lookup(code)())

    def test_an_error_without_a_code_is_about_the_database(self):
        assert not refuses_row(psycopg.OperationalError("server closed the connection"))
