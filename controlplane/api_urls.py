"""Routes of /api/v1/. Each app contributes its own router in `<app>/api/urls.py`."""


urlpatterns: list = []
