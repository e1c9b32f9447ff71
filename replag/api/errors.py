"""The error answers the API declares in its OpenAPI document, with one body shape.

Every error is JSON `{"detail": "…"}` naming what was wrong; 422 is FastAPI's
validation answer (a parameter outside its schema). Routes list the statuses
they can answer so clients and schemathesis know them (`responses=errors(404)`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ErrorBody(BaseModel):
    detail: str = Field(description="What was wrong, naming the parameter, region, group or run.")


_WHY = {
    400: "The request cannot be acted on: a body that is not JSON, a policy source that "
    "names several members.",
    401: "The bearer token is missing or wrong.",
    403: "The token lacks the scope this call needs, or the server has no token at all.",
    404: "A region, replica group, replica or run named in the request does not exist.",
    409: "A check or repair of that group (or of every group) is already running.",
    503: "The answer can only come from the results store, which cannot be reached now "
    "(see Retry-After); everything watched answers from memory meanwhile.",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route that can answer these error statuses."""
    return {status: {"model": ErrorBody, "description": _WHY[status]} for status in statuses}
