from rest_framework.pagination import CursorPagination


class NewestFirstCursorPagination(CursorPagination):
    """Keyset pagination, stable under inserts: a million rows page as fast as ten."""

    ordering = ("-collected_at", "-id")
    page_size_query_param = "page_size"
    max_page_size = 500
