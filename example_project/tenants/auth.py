"""Who is calling: the tenant whose API key the request carries (``Authorization: Bearer
<key>``).

The API authenticates by this header alone and never reads a cookie, so a browser
cannot be tricked into sending a tenant's credentials from another site: that is why
its views are exempt from CSRF protection (``csrf_exempt``). A view that trusted the
session cookie instead would need the CSRF check.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from .models import Tenant, hash_api_key


def tenant_for_request(request: HttpRequest) -> Tenant | None:
    """The tenant whose API key is in the request's ``Authorization`` header, if any."""
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        return None
    return Tenant.objects.select_related("plan").filter(api_key_hash=hash_api_key(key)).first()


def unauthorized() -> JsonResponse:
    """The 401 for a request without a valid API key."""
    response = JsonResponse(
        {"message": "an API key is required: Authorization: Bearer <key>"}, status=401
    )
    response["WWW-Authenticate"] = 'Bearer realm="chatsite"'
    return response
