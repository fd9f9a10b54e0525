"""Console input that used to answer 500 is a form error instead (#20)."""

import pytest

from recovery.models import Message
from tests.helpers import make_message, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator_client(client):
    client.force_login(make_user("bad-input-op", "operator"))
    return client


@pytest.mark.parametrize("path", ["/messages/", "/activity/", "/jobs/new"])
def test_offsets_beyond_what_postgresql_takes_are_converted_to_utc(operator_client, path):
    make_message()
    response = operator_client.get(path, {"since": "2026-11-20T10:00:00+20:00"})
    assert response.status_code == 200
    assert b"time zone displacement" not in response.content


def test_an_offset_beyond_a_day_is_a_form_error(operator_client):
    response = operator_client.get("/messages/", {"since": "2026-11-20T10:00:00+99:00"})
    assert response.status_code == 200
    assert b"since: Enter a valid date/time." in response.content


def test_the_utc_conversion_keeps_the_instant(operator_client):
    from recovery.search.filters import MessageFilterForm

    form = MessageFilterForm({"since": "2026-11-20T10:00:00+20:00"})
    assert form.is_valid()
    assert form.cleaned_data["since"].isoformat() == "2026-11-19T14:00:00+00:00"


def test_a_page_beyond_any_offset_is_a_form_error(operator_client):
    response = operator_client.get("/groups/", {"page": "9223372036854775807"})
    assert response.status_code == 200
    assert b"less than or equal to 1000000" in response.content


def test_a_canary_beyond_an_integer_is_a_form_error(operator_client):
    make_message(source_queue="canary.q")
    response = operator_client.post(
        "/jobs/new", {"queue": "canary.q", "canary_size": "99999999999999999999"}
    )
    assert response.status_code == 200
    assert b"less than or equal to 2147483647" in response.content


@pytest.mark.parametrize(
    ("headers", "said"),
    [
        ('{"a": ' * 3000 + "1" + "}" * 3000, b"nested too deep"),
        ('{"ts": {"$t": "timestamp", "v": 1e400}}', b"Not a valid header table"),
        ('{"d": {"$t": "decimal", "v": "NaN"}}', b"Not a valid header table"),
        ('{"i": 1000000000000000000000000000000}', b"Not a valid header table"),
    ],
)
def test_the_edit_form_refuses_headers_the_api_refuses(operator_client, headers, said):
    message = make_message()
    response = operator_client.post(
        f"/messages/{message.pk}/edit", {"headers": headers, "body": "{}"}
    )
    assert response.status_code == 200, response.status_code
    assert said in response.content
    assert Message.objects.get(pk=message.pk).replay_count == 0
