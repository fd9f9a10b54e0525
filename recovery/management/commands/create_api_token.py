from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from recovery.models import Activity, ApiToken, Role, set_role


class Command(BaseCommand):
    help = "Create (or reuse) USER, give it ROLE, and print a new API token (shown only once)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--role", choices=[r.value for r in Role], default=Role.VIEWER)
        parser.add_argument("--name", default="", help="label for the token (e.g. the team)")

    def handle(self, *args, username, role, name, **options):
        user, created = get_user_model().objects.get_or_create(username=username)
        if created:
            user.set_unusable_password()
            user.save()
        set_role(user, role)
        token, raw = ApiToken.issue(user, name=name)
        Activity.objects.create(
            user=user,
            action="token_created",
            via="system",
            detail={"token": token.prefix, "role": role},
        )
        self.stdout.write(raw)
