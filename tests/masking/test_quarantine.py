"""The quarantine page's previews are masked too (#32): a real collector quarantines a body over
its limit, and the page shows its first bytes with the secret masked, and no body at all to a
viewer who sees metadata only."""

import pytest

from recovery.models import MaskRule, set_privileges
from tests.helpers.collector import fill_quarantine

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = 64 * 1024
TOKEN = "tok_live_feedface42"


def test_quarantine_previews_are_masked(transactional_db, wired, clean_queues, amqp, client):
    from tests.helpers import make_user

    MaskRule.objects.create(kind="regex", pattern=r"tok_live_[0-9a-f]+")
    MaskRule.objects.create(kind="header", pattern="tenant")
    body = f"token={TOKEN} ".encode() + b"x" * LIMIT
    fill_quarantine(amqp, {"huge-secret": body}, LIMIT)
    viewer = make_user("quinn", "viewer")
    client.force_login(viewer)
    page = client.get("/quarantine/").content.decode()
    assert "huge-secret" in page and "token=[masked]" in page
    assert TOKEN not in page and "acme" not in page
    set_privileges(viewer, bodies=False)
    page = client.get("/quarantine/").content.decode()
    assert "(metadata only: no body)" in page and "token=" not in page
