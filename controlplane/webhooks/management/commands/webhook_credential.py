"""`manage.py webhook_credential TEAM SOURCE SCHEME [...]`: create an inbound webhook credential and
print its secret once (only a hash is kept for API keys, passwords and tokens)."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from controlplane.accounts.models import Team
from controlplane.common.errors import DomainError
from controlplane.webhooks.credentials import credential_create
from controlplane.webhooks.models import CredentialScheme, WebhookSource


class Command(BaseCommand):
    help = "Create an inbound webhook credential for a team and print its secret once."

    def add_arguments(self, parser):
        parser.add_argument("team", help="team slug")
        parser.add_argument("source", choices=WebhookSource.values)
        parser.add_argument("scheme", choices=CredentialScheme.values)
        parser.add_argument("--name", default="")
        parser.add_argument("--header-name", default="x-api-key", help="api_key: the header the sender uses")
        parser.add_argument("--username", default="", help="basic: the user name")
        parser.add_argument("--secret", help="use this secret instead of generating one")
        parser.add_argument("--topic-arn", default="", help="sns_topic: the allowed topic")
        parser.add_argument("--config", default="{}",
                            help="oidc: JSON {audience, email[, public_keys]} (default: Google's keys, fetched)")

    def handle(self, *args, **opts):
        team = Team.objects.filter(slug=opts["team"]).first()
        if team is None:
            raise CommandError(f"no team with slug {opts['team']!r}")
        try:
            cred, secret = credential_create(
                team=team, source=opts["source"], scheme=opts["scheme"], name=opts["name"],
                header_name=opts["header_name"], username=opts["username"], secret=opts["secret"],
                topic_arn=opts["topic_arn"], config=json.loads(opts["config"]),
            )
        except (DomainError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"credential {cred.pk} for {team.slug} {cred.source} {cred.scheme}")
        if secret:
            self.stdout.write(f"secret (shown once): {secret}")
