import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from recovery.models import Role, set_role


class Command(BaseCommand):
    help = "Create the first admin (ADMIN_USERNAME / ADMIN_PASSWORD) if it does not exist."

    def handle(self, *args, **options):
        username = os.environ.get("ADMIN_USERNAME", "admin")
        password = os.environ.get("ADMIN_PASSWORD", "lazarus-admin")
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is None:
            user = User.objects.create_superuser(username, "", password)
            set_role(user, Role.ADMIN)
            self.stdout.write(f"created admin login: {username} / {password}")
        else:
            self.stdout.write(f"admin login: {username} (existing user; password unchanged)")
