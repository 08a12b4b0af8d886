"""Logging: plain or JSON lines, and one access-log line per request.

``configure(log_format, level, access_log)`` sets the root handler (stderr) once for the
router and uvicorn alike: ``plain`` is ``TIME LEVEL LOGGER: MESSAGE``; ``json`` is one JSON
object per line with ``time``, ``level``, ``logger``, ``message``, a ``traceback`` when an
exception is logged, and the access fields below. The access logger ``lmroute.access``
logs at INFO whatever ``level`` is (``--no-access-log`` turns it off).

``AccessLog`` is ASGI middleware around the whole app. Per request it logs: method, path,
status (499 when the client left before its reply ended, ``router.disconnect``),
request id (the ``x-request-id`` answered), tenant (its name, never its key), policy,
replica and reason (the ``x-lmroute-*`` headers as the client got them), TTFT (first
body byte) and total seconds.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.disconnect import CLIENT_CLOSED
from router.forward import passes_body

ACCESS = logging.getLogger("lmroute.access")
_HEADERS = {b"x-request-id": "request_id", b"x-lmroute-policy": "policy",
            b"x-lmroute-replica": "replica", b"x-lmroute-reason": "reason"}
_FIELDS = ("method", "path", "status", "request_id", "tenant", "policy", "replica", "reason",
           "ttft_s", "total_s")


def _when(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) \
        + f".{int(record.msecs):03d}Z"


class PlainFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{_when(record)} {record.levelname} {record.name}: {record.getMessage()}"
        access = getattr(record, "access", None)
        if isinstance(access, dict):
            line += " " + " ".join(f"{k}={access[k]}" for k in _FIELDS if access.get(k) is not None)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"time": _when(record), "level": record.levelname,
                               "logger": record.name, "message": record.getMessage()}
        access = getattr(record, "access", None)
        if isinstance(access, dict):
            out.update(access)
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def configure(log_format: str, level: str, access_log: bool) -> None:
    if log_format not in ("plain", "json"):
        raise ValueError(f"--log-format must be plain or json, not {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else PlainFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    ACCESS.setLevel(logging.INFO if access_log else logging.CRITICAL + 1)


class AccessLog:
    """ASGI middleware: one ``lmroute.access`` line per HTTP request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not ACCESS.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        entry: dict[str, Any] = {"method": scope["method"], "path": scope["path"], "status": 500}

        async def logged(message: Message) -> None:
            if message["type"] == "http.response.start":
                entry["status"] = message["status"]
                for key, value in message.get("headers", []):
                    name = _HEADERS.get(key.lower())
                    if name is not None:
                        entry[name] = value.decode("latin-1")
            elif message["type"] == "http.response.body" and "ttft_s" not in entry \
                    and message.get("body"):
                entry["ttft_s"] = round(time.perf_counter() - t0, 6)
            await send(message)

        try:
            await self.app(scope, receive, passes_body(logged, send))
        finally:
            state = scope.get("state") or {}
            if state.get("client_gone"):
                entry["status"] = CLIENT_CLOSED
            entry["tenant"] = state.get("tenant")
            entry["total_s"] = round(time.perf_counter() - t0, 6)
            ACCESS.info("%s %s %s", entry["method"], entry["path"], entry["status"],
                        extra={"access": entry})
