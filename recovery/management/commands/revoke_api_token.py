from django.core.management.base import BaseCommand, CommandError

from recovery.models import Activity, ApiToken


class Command(BaseCommand):
    help = (
        "Revoke the API token whose printed key starts with PREFIX (its first 8 characters, "
        "e.g. lz_AbCdE), or with --user every active token of USER. Takes effect at once."
    )

    def add_arguments(self, parser):
        parser.add_argument("prefix", nargs="?", help="first 8 characters of the token")
        parser.add_argument("--user", help="revoke every active token of this user instead")

    def handle(self, *args, prefix, user, **options):
        if bool(prefix) == bool(user):
            raise CommandError("give either PREFIX or --user USER")
        match = {"prefix": prefix[:8]} if prefix else {"user__username": user}
        tokens = list(
            ApiToken.objects.select_related("user").filter(revoked_at__isnull=True, **match)
        )
        if not tokens:
            raise CommandError(f"no active token matches {prefix or 'user ' + user}")
        if prefix and len(tokens) > 1:
            # Prefixes are short; revoking a stranger's token by accident is worse than asking.
            listing = ", ".join(f"#{t.pk} of {t.user.get_username()}" for t in tokens)
            raise CommandError(
                f"{len(tokens)} active tokens start with {prefix}: {listing}; "
                "revoke by --user, or with the admin API POST /api/v1/tokens/{id}/revoke"
            )
        for token in tokens:
            token.revoke()
            Activity.record(
                None,
                "token_revoked",
                detail={"token": token.prefix, "owner": token.user.get_username()},
                via="system",
            )
            self.stdout.write(f"revoked {token.prefix} of {token.user.get_username()}")
