"""What the API's admin resources share: strict JSON fields (a number is no name, "5" is no
team), id-ordered cursor pages, and ``Logged``, which writes every change as an activity row."""

from django.db import models
from rest_framework import serializers

from recovery.api.pagination import StrictCursorPagination
from recovery.api.params import StrictCharField
from recovery.api.permissions import AdminOnly
from recovery.models import Activity


class StrictTeamField(serializers.PrimaryKeyRelatedField):
    """A team's id, an integer (DRF alone would take "5")."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("incorrect_type", data_type=type(data).__name__)
        return super().to_internal_value(data)


class StrictModelSerializer(serializers.ModelSerializer):
    # JSON bodies typed as the schema says: a number is no name.
    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.CharField: StrictCharField,
    }


class ByIdCursorPagination(StrictCursorPagination):
    ordering = ("id",)


class Logged:
    """An admin resource whose every change is an activity row, ``<noun>_created``,
    ``_changed`` or ``_deleted`` (the console's action names for the same change), written by
    ``Activity.record`` with the object as its target, so the row keeps what the console's row
    of the same change keeps; ``records_creator`` saves the caller as the object's
    ``created_by``."""

    permission_classes = [AdminOnly]
    pagination_class = ByIdCursorPagination
    noun = ""
    records_creator = False

    def perform_create(self, serializer):
        extra = {"created_by": self.request.user} if self.records_creator else {}
        created = serializer.save(**extra)
        Activity.record(self.request.user, f"{self.noun}_created", created, via="api")

    def perform_update(self, serializer):
        changed = serializer.save()
        Activity.record(self.request.user, f"{self.noun}_changed", changed, via="api")

    def perform_destroy(self, instance):
        Activity.record(self.request.user, f"{self.noun}_deleted", instance, via="api")
        instance.delete()
