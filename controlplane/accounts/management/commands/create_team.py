"""`manage.py create_team NAME --admin USERNAME [--slug S] [--email E] [--password-prompt]`: create a
team with its first admin (an existing user of that name, else a new one) and that admin's first API
token, whose key is printed once (only its hash is kept)."""

from __future__ import annotations

import getpass

from django.core.management.base import BaseCommand, CommandError

from controlplane.accounts.services import team_create_with_admin
from controlplane.common.errors import DomainError


class Command(BaseCommand):
    help = "Create a team with its first admin and an API token for that admin (the key is printed once)."

    def add_arguments(self, parser):
        parser.add_argument("name", help="the team's display name")
        parser.add_argument("--admin", required=True, help="username of the first admin (created when new)")
        parser.add_argument("--slug", default=None, help="URL name (default: from the name)")
        parser.add_argument("--email", default="", help="the admin's email, for a new user")
        parser.add_argument("--token-name", default="first token")
        parser.add_argument("--password-prompt", action="store_true",
                            help="ask for a dashboard password for the admin (new or existing user)")

    def handle(self, *args, **opts):
        try:
            team, user, created, token, key = team_create_with_admin(
                name=opts["name"], slug=opts["slug"], admin_username=opts["admin"], admin_email=opts["email"],
                token_name=opts["token_name"],
            )
        except DomainError as exc:
            where = f" ({exc.field})" if exc.field else ""
            raise CommandError(f"{exc.message}{where}") from None
        if opts["password_prompt"]:
            password = getpass.getpass(f"password for {user.username}: ")
            if password:
                user.set_password(password)
                user.save(update_fields=["password"])
        self.stdout.write(f"team {team.pk} {team.slug!r} ({team.name})")
        self.stdout.write(f"admin {user.username!r} ({'created' if created else 'existing user'})")
        self.stdout.write(f"token {token.pk} {token.prefix}… key (shown once): {key}")
