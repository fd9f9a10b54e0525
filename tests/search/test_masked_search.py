"""A masked value cannot be found by search (#46 item 8): a message a masking rule covers
matches a substring search only where what a viewer is shown holds the term, through every
search route (the API's stats, groups, list and export, the console's list)."""

import pytest

from recovery.models import MaskRule, Membership, Message, Role, Scope, Team, TeamScope
from recovery.search import index as search_index
from recovery.search.filters import apply_filters
from tests.helpers import make_message, make_user
from tests.helpers.api import ApiClient

pytestmark = pytest.mark.django_db

CARD = b'{"card": {"number": "4111111111111111"}, "order": "A-1093"}'


@pytest.fixture(params=["unindexed", "indexed"])
def cards(request):
    MaskRule.objects.create(kind="json_path", pattern="$.card.number")
    MaskRule.objects.create(kind="header", pattern="x-api-key")
    MaskRule.objects.create(kind="regex", pattern=r"secret-\w+")
    made = {
        "card": make_message(message_id="m-card", source_queue="pay.cards", body=CARD),
        "key": make_message(
            message_id="m-key", source_queue="pay.keys", headers={"x-api-key": "sk_live_9QZ"}
        ),
        "note": make_message(message_id="m-note", body=b"token secret-hunter2 in a note"),
    }
    if request.param == "indexed":
        search_index.index_new()
        assert search_index.unindexed_count() == 0
    return made


def stats_total(client, user, q):
    answer = ApiClient(client, user).get("/api/v1/stats", {"q": q})
    assert answer.status_code == 200, answer.content
    return answer.json()["total"]


@pytest.mark.parametrize(
    "term",
    ['"number": "41', "4111", "41111111", "4111111111111111", "sk_live", "9QZ", "hunter2"],
)
def test_it_never_finds_a_masked_value_by_its_prefix(client, cards, term):
    viewer = make_user("masked-viewer", Role.VIEWER)
    assert stats_total(client, viewer, term) == 0


@pytest.mark.parametrize(
    ("term", "found"),
    [
        ("A-1093", 1),
        ('"order": "A-10', 1),
        ("m-card", 1),
        ("x-api-key", 1),
        # Candidates come from the stored text, which never holds the mask itself.
        ("[masked]", 0),
    ],
)
def test_it_finds_what_the_viewer_is_shown(client, cards, term, found):
    viewer = make_user("masked-viewer", Role.VIEWER)
    assert stats_total(client, viewer, term) == found


def test_it_never_lists_or_groups_a_masked_value_anywhere(client, cards):
    admin = make_user("masked-admin", Role.ADMIN)  # masks apply to admins as well
    api = ApiClient(client, admin)
    assert api.get("/api/v1/messages", {"q": "41111"}).json()["results"] == []
    assert api.get("/api/v1/groups", {"q": "41111"}).json()["results"] == []
    export = api.get("/api/v1/messages/export", {"q": "41111"})
    assert export.status_code == 200 and b"".join(export.streaming_content) == b""
    listed = api.get("/api/v1/messages", {"q": "A-1093"}).json()["results"]
    assert [m["id"] for m in listed] == [cards["card"].pk]
    client.force_login(admin)
    assert list(client.get("/messages/", {"q": "41111"}).context["messages_page"]) == []
    shown = client.get("/messages/", {"q": "A-1093"}).context["messages_page"]
    assert [m.pk for m in shown] == [cards["card"].pk]


def test_a_teams_rule_masks_its_messages_only(client):
    payments = Team.objects.create(name="payments")
    TeamScope.objects.create(team=payments, queue_pattern="pay.*")
    MaskRule.objects.create(kind="json_path", pattern="$.card.number", team=payments)
    make_message(message_id="theirs", source_queue="pay.cards", body=CARD)
    make_message(message_id="open", source_queue="shop.cards", body=CARD)
    viewer = make_user("team-viewer", None)
    Membership.objects.create(user=viewer, team=payments, role="viewer")
    outsider = make_user("global-viewer", Role.VIEWER)
    assert stats_total(client, viewer, "41111") == 0
    assert stats_total(client, outsider, "41111") == 1  # the unmasked copy in shop.cards
    assert stats_total(client, viewer, "A-1093") == 1


def test_the_systems_own_selection_reads_the_stored_text(cards):
    # A job re-selecting its messages (scope None) is not a viewer.
    system = apply_filters(Message.objects.all(), {"q": "41111"})
    assert list(system.values_list("message_id", flat=True)) == ["m-card"]
    viewer = Scope.of(make_user("scoped-viewer", Role.VIEWER))
    assert not apply_filters(Message.objects.all(), {"q": "41111"}, viewer).exists()
