"""Teams and Scope (#31): the glob syntax, the upgrade path, roles per team, team tokens, and a
job that re-checks its team's scope when it runs."""

import re

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from recovery.access.teams import validate_pattern
from recovery.models import (
    ApiToken,
    Membership,
    Message,
    ReplayJob,
    Role,
    Scope,
    Team,
    TeamScope,
    glob_to_regex,
    role_of,
)
from recovery.replay.jobs import create_job
from recovery.replay.selection import job_queryset, scoped_job_queryset
from tests.helpers import make_message, make_user
from tests.helpers.teams import member, team

pytestmark = pytest.mark.django_db


def test_it_translates_globs_the_same_for_postgresql_and_python():
    assert glob_to_regex("pay.*") == r"^pay\..*$"
    assert glob_to_regex("a?c[1]") == r"^a.c\[1\]$"
    for name, expected in [("pay.cards", True), ("payxcards", False), ("pay.", True)]:
        assert bool(re.match(glob_to_regex("pay.*"), name)) is expected
        with connection.cursor() as cur:
            cur.execute("SELECT %s ~ %s", [name, glob_to_regex("pay.*")])
            assert cur.fetchone()[0] is expected


def test_it_refuses_bad_patterns_as_validation_errors():
    with pytest.raises(ValidationError):
        validate_pattern("a\nb")
    with pytest.raises(ValidationError):
        validate_pattern("x" * 256)
    with pytest.raises(ValidationError):
        TeamScope(team=Team(name="t"), vhost="/").clean()  # no pattern at all


def test_it_keeps_global_roles_while_there_are_no_teams_and_for_users_outside_them():
    viewer = make_user("plain-viewer", Role.VIEWER)
    make_message(source_queue="anything")
    assert Scope.of(viewer).is_global and role_of(viewer) == Role.VIEWER
    assert Scope.of(viewer).messages().count() == 1
    # The first team changes nothing for users outside it.
    member("payer", team("payments", "pay.*"))
    assert Scope.of(viewer).is_global and Scope.of(viewer).messages().count() == 1


def test_a_member_has_only_their_team_roles_over_their_scopes():
    payments, search = team("payments", "pay.*"), team("search", "search.*")
    # A global operator who joins a team as viewer is a viewer there, and sees nothing else.
    user = member("joined", payments, role="viewer", global_role=Role.OPERATOR)
    Membership.objects.create(user=user, team=search, role="operator")
    mine, theirs = make_message(source_queue="pay.cards"), make_message(source_queue="hr.pay")
    found = make_message(source_queue="search.index")
    scope = Scope.of(user)
    assert set(scope.messages()) == {mine, found}
    assert set(scope.messages(minimum=Role.OPERATOR)) == {found}
    assert scope.allows("/", "pay.cards", "") and not scope.allows("/", "hr.pay", "")
    assert not scope.allows("/", "pay.cards", "", minimum=Role.OPERATOR)
    assert not scope.allows("other", "pay.cards", "")
    assert theirs not in scope.messages()
    assert role_of(user) == Role.OPERATOR  # the strongest team role, for the role gates


def test_an_exchange_pattern_covers_unroutable_messages():
    made = Team.objects.create(name="shop")
    TeamScope.objects.create(team=made, exchange_pattern="shop")
    user = member("shopper", made)
    unroutable = make_message(kind="unroutable", source_queue="", source_exchange="shop")
    make_message(source_queue="", source_exchange="shopping")
    assert list(Scope.of(user).messages()) == [unroutable]


def test_admins_stay_global_whatever_their_teams_but_their_team_tokens_do_not():
    payments = team("payments", "pay.*")
    admin = member("boss", payments, role="viewer", global_role=Role.ADMIN)
    assert Scope.of(admin).is_global and Scope.of(admin).role == Role.ADMIN
    token, _raw = ApiToken.issue(admin, team=payments)
    narrowed = Scope.of(admin, token.team_id)
    assert narrowed.team_ids() == [payments.pk] and narrowed.role == Role.VIEWER


def test_a_team_token_is_narrower_never_wider():
    payments, search = team("payments", "pay.*"), team("search", "search.*")
    user = member("both", payments, role="viewer")
    Membership.objects.create(user=user, team=search, role="operator")
    token, _raw = ApiToken.issue(user, team=payments)
    scope = Scope.of(user, token.team_id)
    assert scope.team_ids() == [payments.pk] and scope.role == Role.VIEWER
    with pytest.raises(ValueError):
        ApiToken.issue(user, team=team("hr", "hr.*"))  # not theirs
    Membership.objects.filter(user=user, team=payments).delete()
    assert Scope.of(user, token.team_id).role is None  # left the team: the token does nothing


def test_a_job_selects_in_scope_and_leaves_out_what_left_it_by_the_time_it_runs(
    settings, payments_team, team_operator
):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    payments, user = payments_team, team_operator
    mine = [make_message(source_queue="pay.cards") for _ in range(3)]
    theirs = make_message(source_queue="hr.payroll")
    with pytest.raises(ValidationError):
        create_job(user, message_ids=[theirs.pk], scope=Scope.of(user))
    job = create_job(user, message_ids=[*[m.pk for m in mine], theirs.pk], scope=Scope.of(user))
    assert job.team == payments
    assert set(scoped_job_queryset(job)) == set(mine)
    # Re-scoped in between: the run leaves it out (and the runner logs how many).
    TeamScope.objects.filter(team=payments).update(queue_pattern="pay.cards.eu")
    job = ReplayJob.objects.get(pk=job.pk)
    assert scoped_job_queryset(job).count() == 0 and job_queryset(job).count() == 4
    Message.objects.filter(pk=mine[0].pk).update(source_queue="pay.cards.eu")
    assert list(scoped_job_queryset(job)) == [Message.objects.get(pk=mine[0].pk)]


def test_a_user_operating_for_several_teams_starts_jobs_through_a_team_token(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    user = member("two-hats", team("payments", "pay.*"))
    Membership.objects.create(user=user, team=team("search", "s.*"), role="operator")
    message = make_message(source_queue="pay.cards")
    with pytest.raises(ValidationError, match="several teams"):
        create_job(user, message_ids=[message.pk], scope=Scope.of(user))


@pytest.mark.django_db(transaction=True)
def test_the_migration_keeps_every_existing_user_and_token_as_it_was():
    """0023 -> 0024_teams: no team, every token acting as its user, every role as before."""
    executor = MigrationExecutor(connection)
    executor.migrate([("recovery", "0023_archive_retention_alert_kind")])
    executor.loader.build_graph()
    old = executor.loader.project_state([("recovery", "0023_archive_retention_alert_kind")]).apps
    user = old.get_model("auth", "User").objects.create(username="from-before")
    group = old.get_model("auth", "Group").objects.get_or_create(name="operator")[0]
    user.groups.add(group)
    old.get_model("recovery", "ApiToken").objects.create(user=user, prefix="lz_x", digest="d")
    call_command("migrate", "recovery", verbosity=0)
    token = ApiToken.objects.get(digest="d")
    assert token.team is None and not Team.objects.exists()
    assert role_of(token.user) == Role.OPERATOR and Scope.of(token.user).is_global


def test_leaving_every_team_leaves_no_role_not_the_old_global_one():
    payments = team("payments", "pay.*")
    user = member("leaver", payments, global_role=Role.OPERATOR)
    make_message(source_queue="hr.payroll")
    payments.delete()
    assert role_of(user) is None and Scope.of(user).messages().count() == 0
