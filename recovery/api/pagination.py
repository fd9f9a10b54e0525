"""Cursor pagination for every list: stable under inserts, constant time however deep.

``page_size`` is validated (a bad value is a 400 naming it, not silently the default), and the
schema states its bounds.
"""

import bisect
import json

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import Cursor, CursorPagination

BIGINT = 2**63


class StrictCursorPagination(CursorPagination):
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request):
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        # The length first: int() refuses more than 4,300 digits with a ValueError (a 500).
        digits = raw.isascii() and raw.isdigit() and len(raw) <= len(str(self.max_page_size))
        if not digits or not 1 <= int(raw) <= self.max_page_size:
            raise ValidationError(
                {self.page_size_query_param: [f"A whole number from 1 to {self.max_page_size}."]}
            )
        return int(raw)

    def paginate_queryset(self, queryset, request, view=None):
        self._model = queryset.model  # decode_cursor types a cursor's position by it
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request):
        """DRF's cursor, its position checked against the ordering's first field: a forged
        ``p=abc`` on an id-ordered list, a bigint overflow or a NUL byte reached the query (a
        500); any position no row can have is DRF's 404 "Invalid cursor", as a bad cursor."""
        cursor = super().decode_cursor(request)
        model = getattr(self, "_model", None)
        if cursor is None or cursor.position is None or model is None:
            return cursor
        field = model._meta.get_field(self.ordering[0].lstrip("-"))
        try:
            if "\x00" in cursor.position:
                raise DjangoValidationError("NUL")
            field.run_validators(field.to_python(cursor.position))
        except DjangoValidationError as exc:
            raise NotFound(self.invalid_cursor_message) from exc
        return cursor

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


class RowsCursorPagination(StrictCursorPagination):
    """Cursor pagination over rows computed whole, in memory, ordered by ``sort_key``.

    For lists that are aggregates (a few hundred failure groups), not querysets. The cursor is
    the sort key of a page's edge row (``position`` below), so a page is found by binary search,
    and later pages stay right when rows are added in between, as with the queryset cursors.
    ``sort_key(row)`` is a unique (str or int, ...) tuple.
    """

    ordering = None  # sort_key orders the rows

    def paginate_rows(self, rows, sort_key, request):
        self.request = request
        self.base_url = request.build_absolute_uri()
        self.page_size = self.get_page_size(request)
        keyed = sorted(((sort_key(row), row) for row in rows), key=lambda pair: pair[0])
        keys = [key for key, _row in keyed]
        rows = [row for _key, row in keyed]
        cursor = self.decode_cursor(request)
        if cursor is None:
            start, end = 0, self.page_size
        else:
            edge = self._key(cursor.position, keys)
            if cursor.reverse:
                end = bisect.bisect_left(keys, edge)
                start = max(0, end - self.page_size)
            else:
                start = bisect.bisect_right(keys, edge)
                end = start + self.page_size
        page = rows[start:end]
        self._next = keys[end - 1] if page and end < len(rows) else None
        self._previous = keys[start] if page and start > 0 else None
        return page

    def paginate_keyset(self, fetch, sort_key, example_key, request):
        """As ``paginate_rows``, for rows a query sorts and pages itself: ``fetch(edge, reverse,
        limit)`` returns at most ``limit`` rows after the sort key ``edge`` (None: from the
        first), in order, or with ``reverse`` the rows before it, nearest first.
        ``example_key`` types a cursor's position (a forged one is a 404)."""
        self.request = request
        self.base_url = request.build_absolute_uri()
        self.page_size = self.get_page_size(request)
        cursor = self.decode_cursor(request)
        edge = None if cursor is None else self._key(cursor.position, [example_key])
        reverse = cursor is not None and cursor.reverse
        rows = fetch(edge, reverse, self.page_size + 1)
        more = len(rows) > self.page_size
        page = rows[: self.page_size]
        if reverse:
            page.reverse()
            self._previous = sort_key(page[0]) if more else None
            self._next = sort_key(page[-1]) if page else None
        else:
            self._next = sort_key(page[-1]) if more else None
            self._previous = sort_key(page[0]) if page and edge is not None else None
        return page

    def _key(self, position, keys):
        """The sort key a cursor's position names (a JSON list, typed like the rows' keys)."""
        try:
            edge = tuple(json.loads(position))
            if keys and [type(v) for v in edge] != [type(v) for v in keys[0]]:
                raise ValueError(position)
            # Passed on to SQL: PostgreSQL refuses NUL in text and integers past a bigint.
            if any("\x00" in v if isinstance(v, str) else not -BIGINT <= v < BIGINT for v in edge):
                raise ValueError(position)
        except (TypeError, ValueError, RecursionError) as exc:
            raise NotFound(self.invalid_cursor_message) from exc
        return edge

    def _link(self, key, reverse):
        if key is None:
            return None
        position = json.dumps(list(key), separators=(",", ":"))
        return self.encode_cursor(Cursor(offset=0, reverse=reverse, position=position))

    def get_next_link(self):
        return self._link(self._next, reverse=False)

    def get_previous_link(self):
        return self._link(self._previous, reverse=True)
