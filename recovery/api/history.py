"""history: what was done to a message id (replays and their outcomes, discards, restores,
retention's delete), kept after the message itself is deleted (recovery.models.history)."""

from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers

from recovery.api.pagination import StrictCursorPagination
from recovery.api.params import validated
from recovery.models import HistoryAction, MessageHistory, scope_of


class HistorySerializer(serializers.ModelSerializer):
    stored = serializers.BooleanField(
        help_text="The message is still in the store (`store_id` is its id under /messages)."
    )

    class Meta:
        model = MessageHistory
        fields = [
            "id",
            "message_id",
            "store_id",
            "stored",
            "vhost",
            "queue",
            "group_key",
            "group_label",
            "action",
            "who",
            "via",
            "at",
            "job_id",
            "outcome",
            "target_exchange",
            "target_routing_key",
            "detail",
        ]
        extra_kwargs = {
            "message_id": {"help_text": "The AMQP message id ('' if it had none)."},
            "who": {"help_text": "The username then; '' = the system (retention)."},
            "outcome": {
                "help_text": "A replay's outcome: confirmed (the broker has it), returned, "
                "nacked or failed; '' for other actions."
            },
        }


class HistoryFilterParams(serializers.Serializer):
    message_id = serializers.CharField(required=False, allow_blank=True, max_length=255)
    action = serializers.ChoiceField(choices=HistoryAction.choices, required=False)


class NewestActionFirstPagination(StrictCursorPagination):
    ordering = ("-at", "-id")


@extend_schema(
    parameters=[HistoryFilterParams],
    summary="What was done to messages, newest first (kept after they are deleted)",
    description="One row per replay (with its outcome), discard, restore and retention delete, "
    "kept for `HISTORY_DAYS` whether or not the message is still stored: `message_id=` answers "
    "whether a message was ever replayed, by whom, and whether it arrived.",
)
class HistoryList(generics.ListAPIView):
    serializer_class = HistorySerializer
    pagination_class = NewestActionFirstPagination
    team_scoped = True

    def get_queryset(self):
        return MessageHistory.objects.filter(
            scope_of(self.request).history_q(),
            **validated(HistoryFilterParams, self.request.query_params),
        )

    def paginate_queryset(self, queryset):
        page = super().paginate_queryset(queryset)
        return None if page is None else MessageHistory.mark_stored(page)
