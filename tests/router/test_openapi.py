"""``/openapi.json`` describes every route the router serves, and only those: the app's
route table (``create_app``) against the document, for each gate configuration (tenants
or not, admin key or not)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from servers import Server, replica, router

from router.app import create_app
from router.openapi import openapi_document
from router.settings import Settings

ALWAYS_404 = {"/admin/policy", "/admin/split/weights", "/admin/replicas",
              "/admin/replicas/drain"}  # the admin API without a key: answers 404, as if absent


def _served(settings: Settings) -> set[tuple[str, str]]:
    app = create_app(settings)
    return {(route.path, method.lower()) for route in app.router.routes
            for method in getattr(route, "methods", None) or () if method != "HEAD"}


def _described(doc: dict[str, object]) -> set[tuple[str, str]]:
    paths = doc["paths"]
    assert isinstance(paths, dict)
    return {(path, method) for path, ops in paths.items() for method in ops}


@pytest.mark.parametrize(("tenants", "admin"), [(False, False), (True, False), (False, True),
                                                (True, True)])
def test_the_document_lists_every_served_route(tmp_path: Path, tenants: bool,
                                               admin: bool) -> None:
    keys = tmp_path / "tenants.toml"
    keys.write_text('[tenants.a]\nkeys = ["sk-a"]\n')
    settings = Settings(backends=("http://127.0.0.1:9",), admin_key="k" if admin else "",
                        api_keys=str(keys) if tenants else "")
    served = _served(settings)
    if not admin:  # without a key the admin API answers 404: not part of the surface
        served = {(p, m) for p, m in served if p not in ALWAYS_404}
    if tenants and not admin:  # internal routes answer 404 to everyone (router.gate)
        internal = _described(openapi_document(tenants=False, admin=False)) - \
            _described(openapi_document(tenants=True, admin=False))
        served -= internal
    described = _described(openapi_document(tenants=tenants, admin=admin))
    assert served - described == set(), "served but not described"
    assert described - served == set(), "described but not served"


def test_the_live_document_has_the_surface(start_servers) -> None:  # type: ignore[no-untyped-def]
    rep: Server = start_servers(replica())
    lm: Server = start_servers(router([rep.url], "--admin-key", "k"))
    doc = httpx.get(lm.url + "/openapi.json").json()
    for path in ("/v1/embeddings", "/v1/responses/{response_id}/cancel", "/v1/messages",
                 "/v1/audio/transcriptions", "/version", "/v1/load_lora_adapter",
                 "/admin/replicas/drain"):
        assert path in doc["paths"], path
    upload = doc["paths"]["/v1/audio/transcriptions"]["post"]["requestBody"]["content"]
    assert "multipart/form-data" in upload
