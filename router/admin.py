"""The admin API: read and switch the routing policy at runtime, without dropping a request.

    GET  /admin/policy           {"policy", "options", "state"}: the active policy, the
                                 options it was built from, its ``describe()``
    POST /admin/policy           {"policy": NAME, "options": {...}} -> the new active policy
                                 (``split``: options ``{"spec": "A=fixed:50,..."}`` or the
                                 JSON form of ``policies.split``)
    POST /admin/split/weights    {"weights": {"A": 0, "B": 100}} -> the split, re-weighted

Auth (``router.gate``, access "admin"): ``Authorization: Bearer KEY`` with the
``admin_key`` setting, compared in constant time; a missing or wrong key gets 401
(OpenAI-shaped). With no key configured the API is off: its routes answer 404, as if
absent. Bodies come through the gate (size limit, decoding) and ``load_json`` (nesting).

Atomic swap: the new policy object is built (and validated) first, then assigned to
``Proxy.policy`` in one statement. The router runs on one event loop, so no request sees
half a switch; each request captures the policy object when it starts, and its
``dispatched``/``observe`` calls go to that object even if a switch lands meanwhile (an
in-flight request finishes and reports to the policy that chose it). A re-weighted split
keeps its arm policy objects (their state carries over); a new policy starts fresh.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from policies import registry
from router.errors import BadRequest
from router.jsonbody import load_json
from router.proxy import Proxy


class PolicyAdmin:
    """Owns the active policy's name and options; swaps ``proxy.policy``."""

    def __init__(self, proxy: Proxy, name: str, options: Mapping[str, Any]):
        self.proxy = proxy
        self.name = name
        self.options = dict(options)
        self.switches = 0

    def state(self) -> dict[str, Any]:
        return {"policy": self.name, "options": self.options, "switches": self.switches,
                "state": self.proxy.policy.describe()}

    def switch(self, name: str, options: Mapping[str, Any]) -> None:
        try:
            policy = registry.create(name, options or None)
        except (registry.UnknownPolicy, registry.BadPolicyOptions) as exc:
            raise BadRequest(str(exc.args[0] if exc.args else exc), param="policy") from None
        self.proxy.policy = policy  # the swap: one assignment on the event loop
        self.name, self.options = name, dict(options)
        self.switches += 1

    def reweight(self, weights: Mapping[str, float]) -> None:
        """New arm weights for the active policy (a split; its arm objects are kept)."""
        try:
            policy, options = registry.reweight(self.proxy.policy, weights)
        except registry.BadPolicyOptions as exc:
            raise BadRequest(str(exc), param="weights") from None
        self.proxy.policy = policy
        self.options = options
        self.switches += 1


async def _body(request: Request) -> dict[str, Any]:
    data = load_json(await request.body())
    if not isinstance(data, dict):
        raise BadRequest("admin body must be a JSON object")
    return data


def _json(data: Any) -> Response:
    return Response(orjson.dumps(data), media_type="application/json")


def admin_routes(admin: PolicyAdmin) -> list[Route]:
    """The admin routes (unguarded: ``Routes`` puts them behind the gate); their errors
    are raised, rendered by the app's handler."""

    async def get_policy(request: Request) -> Response:
        return _json(admin.state())

    async def set_policy(request: Request) -> Response:
        body = await _body(request)
        name = body.get("policy")
        options = body.get("options") or {}
        if not isinstance(name, str) or not isinstance(options, dict):
            raise BadRequest('expected {"policy": NAME, "options": {...}}', param="policy")
        if isinstance(body.get("split"), str | dict):  # shorthand for split's spec
            options = {"spec": body["split"]}
        admin.switch(name, options)
        return _json(admin.state())

    async def set_weights(request: Request) -> Response:
        weights = (await _body(request)).get("weights")
        if not isinstance(weights, dict) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in weights.values()):
            raise BadRequest('expected {"weights": {"ARM": number, ...}}', param="weights")
        admin.reweight({str(k): float(v) for k, v in weights.items()})
        return _json(admin.state())

    return [Route("/admin/policy", get_policy, methods=["GET"]),
            Route("/admin/policy", set_policy, methods=["POST"]),
            Route("/admin/split/weights", set_weights, methods=["POST"])]
