"""Keyset pagination for newest-first lists: constant time however deep the page.

A page ends with the row it stopped at; the next page asks for rows strictly older than that
row's (timestamp, id), which the (-timestamp, -id) indexes answer directly. No OFFSET, no COUNT.
"""

from dataclasses import dataclass

from console.forms.paging import anchor_of

__all__ = ["Page", "anchor_of", "newest_first_page", "query_without"]


@dataclass
class Page:
    rows: list
    next_before: int | None


def newest_first_page(queryset, before, size, time_field, *, visible):
    """Rows of ``queryset`` (ordered by -time_field, -id) older than the row with pk ``before``
    (an int from ``anchor_of``, or None).

    ``visible``: the rows the caller may see (their scope, without the page's filters). The
    anchor is looked up there only: an id outside it behaves exactly as an id no row has (the
    first page), or a page would tell whether another team's id exists, and when."""
    if before is not None:
        anchor = visible.filter(pk=before).values(time_field, "id").first()
        if anchor is not None:
            queryset = queryset.filter(**{f"{time_field}__lte": anchor[time_field]}).exclude(
                **{time_field: anchor[time_field], "id__gte": anchor["id"]}
            )
    rows = list(queryset.order_by(f"-{time_field}", "-id")[: size + 1])
    next_before = rows[size - 1].pk if len(rows) > size else None
    return Page(rows=rows[:size], next_before=next_before)


def query_without(request, *names):
    """The request's query string minus ``names`` (for "next page" links that keep filters)."""
    query = request.GET.copy()
    for name in names:
        query.pop(name, None)
    return query.urlencode()
