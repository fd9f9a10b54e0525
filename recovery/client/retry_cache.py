"""The publisher's retry cache (the seeds' RetryCache): every message it owns until the broker acks.

The seeds keep sent messages in a map, delete them on ack and resend what stays too long. Two
changes make it bounded and cheap here: the cache only ever holds up to ``window`` messages (the
publisher blocks ``publish`` beyond that), and unconfirmed messages are kept in delivery-tag order,
which is also send order, so a multiple-ack pops from the front and the timeout scan stops at the
first message still young enough. Only the publisher's I/O thread touches a RetryCache.

The bulk replay publisher of Lazarus keeps its own entries in one too (through
``connection_loop.ConnectionLoop``): anything with a ``sent_at`` can be cached.
"""

import collections
import dataclasses
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


@dataclasses.dataclass(slots=True, eq=False)
class Pending:
    """One message the publisher still owns, with what the audit log and a give-up need."""

    message_id: str
    exchange: str
    routing_key: str
    body: bytes
    properties: object  # pika.BasicProperties
    first_attempt_at: float  # epoch seconds of publish(): the audit window the message belongs to
    attempts: int = 0  # publish attempts of the message itself (forwards not counted)
    sent_at: float = 0.0  # monotonic time of the current attempt
    sent_ts_ms: int = 0  # wall-clock epoch ms of the current attempt, for the log
    returned: str | None = None  # reply text of a basic.return for the current attempt
    give_up: tuple | None = None  # (kind, reason, detail) once handed towards Lazarus
    failures: int = 0  # attempts that ended in a nack or a confirm timeout

    @property
    def forwarding(self):
        return self.give_up is not None


class Attempt(Protocol):
    sent_at: float  # monotonic time of the current attempt


E = TypeVar("E", bound=Attempt)


class RetryCache(Generic[E]):
    """Unconfirmed messages by delivery tag, plus the ones waiting to be (re)sent."""

    def __init__(self):
        self.unconfirmed: collections.OrderedDict[int, E] = collections.OrderedDict()
        self.to_send: collections.deque[E] = (
            collections.deque()
        )  # resends and forwards, before new messages

    def __len__(self):
        return len(self.unconfirmed) + len(self.to_send)

    def sent(self, tag, entry):
        self.unconfirmed[tag] = entry

    def confirmed(self, tag, multiple):
        """Pop and return the entries a basic.ack / basic.nack covers."""
        if not multiple:
            entry = self.unconfirmed.pop(tag, None)
            return [entry] if entry is not None else []
        done = []
        while self.unconfirmed:
            first = next(iter(self.unconfirmed))
            if first > tag:
                break
            done.append(self.unconfirmed.popitem(last=False)[1])
        return done

    def expired(self, now, timeout):
        """Pop and return entries whose current attempt has waited longer than ``timeout``."""
        done = []
        while self.unconfirmed:
            tag, entry = next(iter(self.unconfirmed.items()))
            if now - entry.sent_at < timeout:
                break
            del self.unconfirmed[tag]
            done.append(entry)
        return done

    def drop_unconfirmed(self):
        """The channel is gone: its delivery tags mean nothing any more."""
        entries = list(self.unconfirmed.values())
        self.unconfirmed.clear()
        return entries

    def find_unconfirmed(self, matches: Callable[[E], bool]) -> E | None:
        """The first unconfirmed entry that ``matches`` (the one a basic.return is about);
        returns arrive just before their ack, so the entry is almost always near the front."""
        for entry in self.unconfirmed.values():
            if matches(entry):
                return entry
        return None
