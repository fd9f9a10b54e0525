import pytest

from recovery.models import GroupMapping, Team
from tests.sso.fixtures import oidc_provider, sso, start_provider  # noqa: F401 (fixtures)


@pytest.fixture
def payments():
    """A team the provider's ``payments-oncall`` group maps to, as operators."""
    team = Team.objects.create(name="payments")
    GroupMapping.objects.create(group="payments-oncall", team=team, team_role="operator")
    return team
