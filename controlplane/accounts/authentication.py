"""Token authentication placeholder; replaced by the accounts API work."""
from rest_framework.authentication import BaseAuthentication


class ApiTokenAuthentication(BaseAuthentication):
    def authenticate(self, request):
        return None
