from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from recovery.models import Activity, ApiToken, Role, Team, set_role


class Command(BaseCommand):
    help = "Create (or reuse) USER, give it ROLE, and print a new API token (shown only once)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--role", choices=[r.value for r in Role], default=Role.VIEWER)
        parser.add_argument("--name", default="", help="label for the token (e.g. the team)")
        parser.add_argument(
            "--team",
            default=None,
            help="the token acts as this team of USER's (USER must be a member; its role there "
            "applies and --role is not set)",
        )

    def handle(self, *args, username, role, name, team, **options):
        user, created = get_user_model().objects.get_or_create(username=username)
        if created:
            user.set_unusable_password()
            user.save()
        acting = None
        if team is not None:
            acting = Team.objects.filter(name=team).first()
            if acting is None or not user.memberships.filter(team=acting).exists():
                raise CommandError(f"{username} is not a member of a team named {team!r}")
        else:
            set_role(user, role)
        token, raw = ApiToken.issue(user, name=name, team=acting)
        detail = {"token": token.prefix, "role": role}
        if acting is not None:
            detail = {"token": token.prefix, "team": acting.name}
        Activity.record(user, "token_created", detail=detail, via="system")
        self.stdout.write(raw)
