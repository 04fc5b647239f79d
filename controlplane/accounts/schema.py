"""OpenAPI description of the token authentication (loaded by AccountsConfig.ready, so every
view that uses the default authenticators documents it)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiTokenAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "controlplane.accounts.authentication.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <key>` or `Bearer <key>`. Create keys with POST /api/v1/tokens/.",
        }
