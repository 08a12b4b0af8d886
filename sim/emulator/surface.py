"""The rest of vLLM 0.32's HTTP surface on the emulated replica, in vLLM's response shapes.

Pooling and scoring (``/v1/embeddings``, ``/v1/score`` and ``/score``, ``/v1/rerank``,
``/rerank``, ``/v2/rerank``, ``/classify``, ``/pooling``): deterministic vectors and scores
from the emulator's token ids (``embedding``: 8 floats; ``encoding_format: base64`` as
little-endian float32, as vLLM and the OpenAI SDK's default). ``/detokenize`` inverts what
this replica tokenized (unknown ids read ``<|id|>``). ``/version``. Engine state routes
(vLLM's dev-mode and LoRA routes): ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` (plain-text answers, as vLLM's; a loaded adapter is listed by
``/v1/models`` with its base model as ``parent`` and served as a model name),
``/sleep``, ``/wake_up``, ``GET /is_sleeping``, ``/reset_prefix_cache``.

The generating routes are in ``sim.emulator.generate`` (``/v1/responses``,
``/v1/messages``, audio).
"""

from __future__ import annotations

import base64
import struct
from typing import Any

import orjson
import xxhash
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sim.emulator.tokens import BYTES_PER_TOKEN, tokenize_text

VLLM_VERSION = "0.32.0"
DIMENSIONS = 8


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def vllm_error(status: int, message: str, type_: str = "BadRequestError",
               param: str | None = None) -> Response:
    """vLLM's error body: OpenAI-shaped, with the HTTP status as the code."""
    return json_response({"error": {"message": message, "type": type_, "param": param,
                                    "code": status}}, status)


def pool_usage(tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
            "prompt_tokens_details": None}


def vector(text: str) -> list[float]:
    """A deterministic unit-free vector of ``text`` (the same on every replica)."""
    seed = xxhash.xxh3_64_intdigest(text.encode())
    return [((seed >> (8 * i)) & 0xFF) / 255.0 for i in range(DIMENSIONS)]


def score(a: str, b: str) -> float:
    return (xxhash.xxh32_intdigest((a + "\x00" + b).encode()) % 10_000) / 10_000.0


def texts_of(value: Any) -> list[str]:
    """An ``input``/``text`` field as a list of strings (token ids read as text)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return [" ".join(map(str, value))]
    if isinstance(value, list):
        return [v if isinstance(v, str) else orjson.dumps(v).decode() for v in value]
    return []


class ReplicaSurface:
    """Pooling, scoring, tokenizer and engine-state routes of one emulated replica."""

    def __init__(self, replica: Any) -> None:
        self.replica = replica  # sim.emulator.server.EmulatedReplica
        self.pieces: dict[int, str] = {}
        self.sleeping = False

    def rid(self, prefix: str, request: Request) -> str:
        """An id from the request's ``X-Request-Id`` (as vLLM's), else a counter."""
        return str(self.replica._request_id(request, prefix))

    def fault(self) -> Response | None:
        """The injected ``http_status`` fault (``/_emulator/faults``), if any."""
        status = self.replica.faults.http_status
        return None if status is None else vllm_error(status, "emulated engine fault",
                                                      "InternalServerError")

    async def body(self, request: Request) -> dict[str, Any] | Response:
        faulty = self.fault()
        if faulty is not None:
            return faulty
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return vllm_error(400, "invalid JSON body")
        if not isinstance(body, dict):
            return vllm_error(400, "request body must be a JSON object")
        model = body.get("model")
        if model is not None and not isinstance(model, str):  # vLLM's schema refuses it
            return vllm_error(400, "model: Input should be a valid string", param="model")
        if model is not None and not self.replica.serves(model):
            return vllm_error(404, f"The model `{model}` does not exist.", "NotFoundError",
                              "model")
        return body

    def tokens(self, text: str) -> list[int]:
        ids = tokenize_text(text)
        data = text.encode()
        for i, tid in enumerate(ids):
            piece = data[i * BYTES_PER_TOKEN:(i + 1) * BYTES_PER_TOKEN]
            self.pieces.setdefault(tid, piece.decode("utf-8", "replace"))
        return ids

    def _list(self, prefix: str, request: Request, data: list[dict[str, Any]],
              tokens: int) -> Response:
        return json_response({"id": self.rid(prefix, request), "object": "list",
                              "created": self.replica._created(), "model": self.replica.model,
                              "data": data, "usage": pool_usage(tokens)})

    async def embeddings(self, request: Request) -> Response:
        body = await self.body(request)
        if isinstance(body, Response):
            return body
        texts = texts_of(body.get("input"))
        if not texts:
            return vllm_error(400, "'input' must be a string or an array")
        b64 = body.get("encoding_format") == "base64"
        data = []
        for i, text in enumerate(texts):
            vec = vector(text)
            emb: Any = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode() if b64 \
                else vec
            data.append({"index": i, "object": "embedding", "embedding": emb})
        return self._list("embd", request, data, sum(len(self.tokens(t)) for t in texts))

    async def score(self, request: Request) -> Response:
        body = await self.body(request)
        if isinstance(body, Response):
            return body
        first = texts_of(body.get("text_1", body.get("queries")))
        second = texts_of(body.get("text_2", body.get("documents", body.get("items"))))
        if not first or not second:
            return vllm_error(400, "'text_1' and 'text_2' are required")
        pairs = [(first[0] if len(first) == 1 else first[i], t) for i, t in enumerate(second)]
        data = [{"index": i, "object": "score", "score": score(a, b)}
                for i, (a, b) in enumerate(pairs)]
        return self._list("score", request, data, sum(len(self.tokens(a + b)) for a, b in pairs))

    async def rerank(self, request: Request) -> Response:
        body = await self.body(request)
        if isinstance(body, Response):
            return body
        query = body.get("query")
        docs = texts_of(body.get("documents"))
        if not isinstance(query, str) or not docs:
            return vllm_error(400, "'query' and 'documents' are required")
        results = sorted(({"index": i, "document": {"text": d},
                           "relevance_score": score(query, d)} for i, d in enumerate(docs)),
                         key=lambda r: -float(r["relevance_score"]))  # type: ignore[arg-type]
        top_n = body.get("top_n")
        if isinstance(top_n, int) and top_n > 0:
            results = results[:top_n]
        tokens = sum(len(self.tokens(query + d)) for d in docs)
        return json_response({"id": self.rid("rerank", request), "model": self.replica.model,
                              "usage": {"total_tokens": tokens}, "results": results})

    async def classify(self, request: Request) -> Response:
        body = await self.body(request)
        if isinstance(body, Response):
            return body
        texts = texts_of(body.get("input"))
        data = []
        for i, text in enumerate(texts):
            p = score(text, "label")
            data.append({"index": i, "label": "LABEL_1" if p >= 0.5 else "LABEL_0",
                         "probs": [1.0 - p, p], "num_classes": 2})
        return self._list("classify", request, data, sum(len(self.tokens(t)) for t in texts))

    async def pooling(self, request: Request) -> Response:
        body = await self.body(request)
        if isinstance(body, Response):
            return body
        texts = texts_of(body.get("input"))
        data = [{"index": i, "object": "pooling", "data": vector(t)} for i, t in enumerate(texts)]
        return self._list("pool", request, data, sum(len(self.tokens(t)) for t in texts))

    async def detokenize(self, request: Request) -> Response:
        body = await self.body(request)
        if isinstance(body, Response):
            return body
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            return vllm_error(400, "'tokens' must be an array of integers")
        return json_response({"prompt": "".join(self.pieces.get(t, f"<|{t}|>") for t in ids)})

    async def version(self, request: Request) -> Response:
        return json_response({"version": VLLM_VERSION})

    # -- engine state (vLLM: dev mode, runtime LoRA updating) -----------------------------
    async def load_lora(self, request: Request) -> Response:
        body = await self.body(request)
        if isinstance(body, Response):
            return body
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not isinstance(path, str):
            return vllm_error(400, "Both 'lora_name' and 'lora_path' must be provided.")
        if name in self.replica.loras:
            return vllm_error(400, f"The lora adapter '{name}' has already been loaded.")
        self.replica.loras[name] = path
        return Response(f"Success: LoRA adapter '{name}' added successfully.",
                        media_type="text/plain")

    async def unload_lora(self, request: Request) -> Response:
        body = await self.body(request)
        if isinstance(body, Response):
            return body
        name = body.get("lora_name")
        if not isinstance(name, str) or name not in self.replica.loras:
            return vllm_error(404, f"The lora adapter '{name}' cannot be found.",
                              "NotFoundError")
        del self.replica.loras[name]
        return Response(f"Success: LoRA adapter '{name}' removed successfully.",
                        media_type="text/plain")

    async def sleep(self, request: Request) -> Response:
        self.sleeping = True
        return Response(b"", status_code=200)

    async def wake_up(self, request: Request) -> Response:
        self.sleeping = False
        return Response(b"", status_code=200)

    async def is_sleeping(self, request: Request) -> Response:
        return json_response({"is_sleeping": self.sleeping})

    async def reset_prefix_cache(self, request: Request) -> Response:
        """vLLM's: the GPU prefix cache is emptied (the shared pool keeps its chunks)."""
        reset = getattr(self.replica.engine, "reset_prefix_cache", None)
        if reset is not None:
            reset()
        return Response(b"", status_code=200)

    def routes(self) -> list[Route]:
        post = [("/v1/embeddings", self.embeddings), ("/v1/score", self.score),
                ("/score", self.score), ("/v1/rerank", self.rerank), ("/rerank", self.rerank),
                ("/v2/rerank", self.rerank), ("/classify", self.classify),
                ("/pooling", self.pooling), ("/detokenize", self.detokenize),
                ("/v1/load_lora_adapter", self.load_lora),
                ("/v1/unload_lora_adapter", self.unload_lora), ("/sleep", self.sleep),
                ("/wake_up", self.wake_up), ("/reset_prefix_cache", self.reset_prefix_cache)]
        return [*(Route(path, fn, methods=["POST"]) for path, fn in post),
                Route("/version", self.version, methods=["GET"]),
                Route("/is_sleeping", self.is_sleeping, methods=["GET"])]
