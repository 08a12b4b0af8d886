"""HTTP framing errors answered in OpenAI's error shape.

uvicorn answers a request its parser rejects (a malformed request line or header, bad
chunked framing, an unsupported upgrade) itself, before any app runs, with a plain-text
``400 Invalid HTTP request received.``. ``JsonFramingProtocol`` is uvicorn's httptools
protocol with only that answer replaced: the same status and ``connection: close``, an
OpenAI-shaped JSON body (code ``malformed_http``). What it cannot change: a client that
sends a valid head and then too few body bytes is not a framing error to uvicorn (the app
sees a disconnect), and a connection closed mid-head gets no answer at all.
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from router.errors import error_body


class JsonFramingProtocol(HttpToolsProtocol):
    def send_400_response(self, msg: str) -> None:
        body = error_body(f"malformed HTTP request: {msg}", "invalid_request_error", None,
                          "malformed_http")
        head = [b"HTTP/1.1 400 Bad Request\r\n"]
        for name, value in self.server_state.default_headers:
            head.append(name + b": " + value + b"\r\n")
        head += [b"content-type: application/json\r\n",
                 b"content-length: " + str(len(body)).encode() + b"\r\n",
                 b"connection: close\r\n\r\n", body]
        self.transport.write(b"".join(head))
        self.transport.close()
