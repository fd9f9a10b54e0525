"""The errors every layer of Lazarus raises, in one leaf module (it imports nothing of ours).

Views, the API and tasks catch these without importing the code that raises them, so no layer
has to reach up into another to know what can go wrong.
"""

from django.core.exceptions import ValidationError


class ManagementError(RuntimeError):
    """The RabbitMQ management HTTP API refused or could not be reached."""


class UnstorableDelivery(ValueError):
    """A delivery that cannot become a row; the collector quarantines it with this reason."""


class ReplayError(Exception):
    """The message could not be replayed; the reason is for the operator."""


class BrokerUnavailable(ReplayError):
    """RabbitMQ could not be reached; nothing was sent (the message is as it was)."""


class StateError(ReplayError, ValidationError):
    """The message or job is not in a state that allows this (a conflict, HTTP 409).

    Also a Django ValidationError, so form and view code that catches ValidationError shows it.
    """

    def __init__(self, message):
        ValidationError.__init__(self, message, code="conflict")

    def __str__(self):
        return self.messages[0]


class AuditError(RuntimeError):
    """The audit could not run or its results could not be loaded."""
