"""The activity log: filterable by user, action, channel, message and time; newest first."""

import pytest

from recovery.models import Activity
from tests.helpers import make_message

pytestmark = pytest.mark.django_db


def test_it_filters_the_log(client, viewer, operator, admin_user):
    message = make_message()
    a = Activity.objects.create(user=operator, action="replay", message=message, via="console")
    b = Activity.objects.create(user=operator, action="discard", message=message, via="api")
    c = Activity.objects.create(user=admin_user, action="role_changed", detail={"username": "x"})
    client.force_login(viewer)

    def shown(**params):
        return [e.pk for e in client.get("/activity/", params).context["entries"]]

    assert shown() == [c.pk, b.pk, a.pk]
    assert shown(user="otto") == [b.pk, a.pk]
    assert shown(action="replay") == [a.pk]
    assert shown(via="api") == [b.pk]
    assert shown(message=message.pk) == [b.pk, a.pk]
    page = client.get("/activity/", {"user": "ada"}).content.decode()
    assert "role_changed" in page and "user x" in page


def test_it_pages_through_a_long_log(client, viewer, operator):
    for i in range(130):
        Activity.objects.create(user=operator, action="replay", detail={"i": i})
    client.force_login(viewer)
    first = client.get("/activity/")
    second = client.get("/activity/", {"before": first.context["next_before"]})
    assert len(first.context["entries"]) == 100
    assert len(second.context["entries"]) == 30
    assert second.context["next_before"] is None
