"""OpenAPI generation: every operation documents the errors it can answer, as problem+json.

Rather than repeating 401/403/429/... on each view, ``LazarusAutoSchema`` adds them from what the
operation is: every operation can be unauthenticated (401), forbidden (403), throttled (429) or
fail (500); one with query parameters or a body can be invalid (400); one with a path id or a
cursor can miss (404); one with a body can send the wrong media type (415). Views add their own
(409, 422, 503) with ``extend_schema(responses=...)``.
"""

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter

from recovery.api.errors import PROBLEM_CONTENT_TYPE, ProblemSerializer

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[\\x20-\\x7e]+$"},
    location=OpenApiParameter.HEADER,
    required=False,
    description="Any unique string up to 255 characters (a UUID). A retry of the same request "
    "with the same key by the same user gets the first response back (with the header "
    "`Idempotent-Replayed: true`) and sends nothing again. The same key on a different request "
    "is a 422. Keys are kept for `IDEMPOTENCY_TTL_HOURS` (24 h).",
)

NO_NUL = "^[^\\u0000]*$"

ERROR_DESCRIPTIONS = {
    "400": "Invalid input; `errors` names each field.",
    "401": "No token, or an invalid or revoked one.",
    "403": "Your role does not allow this.",
    "404": "No such object (or an invalid pagination cursor).",
    "409": "Conflict with the object's current state.",
    "415": "Send `application/json`.",
    "422": "The Idempotency-Key was already used for a different request.",
    "429": "Rate limit of your token exceeded; retry after `Retry-After` seconds.",
    "500": "Internal error (logged).",
    "503": "RabbitMQ is unreachable; nothing was sent.",
}


class LazarusAutoSchema(AutoSchema):
    def get_tags(self):
        # /api/v1/<resource>/... -> the resource, so the docs group operations by it.
        parts = self.path.strip("/").split("/")
        return [parts[2]] if len(parts) > 2 and parts[:2] == ["api", "v1"] else super().get_tags()

    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        parameters = operation.get("parameters", [])
        for parameter in parameters:
            schema = parameter.get("schema", {})
            free_text = not ({"enum", "format", "pattern"} & set(schema))
            if parameter["in"] == "query" and schema.get("type") == "string" and free_text:
                # Text parameters are refused with a NUL character (PostgreSQL text).
                schema["pattern"] = NO_NUL
        codes = ["401", "403", "429", "500"]
        has_body = "requestBody" in operation
        if has_body or any(p["in"] in ("query", "header") for p in parameters):
            codes.append("400")
        if any(p["in"] == "path" or p["name"] == "cursor" for p in parameters):
            codes.append("404")
        if has_body:
            codes.append("415")
        responses = operation["responses"]
        problem_ref = self.resolve_serializer(ProblemSerializer, "response").ref
        for code in codes:
            responses.setdefault(code, {"description": ERROR_DESCRIPTIONS[code]})
        for code, response in responses.items():
            if code >= "400":
                # Errors declared by views without a body get the problem schema too.
                response["content"] = {PROBLEM_CONTENT_TYPE: {"schema": problem_ref}}
                response.setdefault("description", ERROR_DESCRIPTIONS.get(code, ""))
                if response["description"] in ("", "No response body"):
                    response["description"] = ERROR_DESCRIPTIONS.get(code, "")
        responses["429"]["headers"] = {
            "Retry-After": {
                "schema": {"type": "integer"},
                "description": "Seconds until the token's rate window resets.",
            }
        }
        operation["responses"] = dict(sorted(responses.items()))
        return operation
