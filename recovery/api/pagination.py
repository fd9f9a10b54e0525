"""Cursor pagination for every list: stable under inserts, constant time however deep.

``page_size`` is validated (a bad value is a 400 naming it, not silently the default), and the
schema states its bounds.
"""

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import CursorPagination


class StrictCursorPagination(CursorPagination):
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request):
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= self.max_page_size:
            raise ValidationError(
                {self.page_size_query_param: [f"A whole number from 1 to {self.max_page_size}."]}
            )
        return int(raw)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"].update(minimum=1, maximum=self.max_page_size)
                parameter["description"] = f"Results per page (default {self.page_size})."
            else:
                parameter["description"] = "Opaque: the `next`/`previous` link of a page has it."
        return parameters


class NewestFirstCursorPagination(StrictCursorPagination):
    """Messages (the default pagination class)."""

    ordering = ("-collected_at", "-id")
