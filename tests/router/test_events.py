"""KV-event ingestion: our keys from engine blocks, sequence tracking, both encodings.

Publishers are real ZMQ sockets on 127.0.0.1: the emulated replica's (sim/kv_events.py,
map encoding), and raw pyzmq PUB/ROUTER sockets speaking vLLM's wire format (positional
encoding, replay). The index is a real MemoryIndex.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
import zmq
from servers import replica
from servers import router as router_server
from servers_redis import free_port

from router.events import EngineEvents, KvIngest, parse_sources
from router.index import MemoryIndex
from router.kv_blocks import ChainTracker, Stored, decode_payload
from router.prefix import root_key, token_chain
from router.tokenizer import ChatTokenizer, TemplateFailed
from sim.emulator.kv_events import all_blocks_cleared, block_removed, block_stored

R = "http://r1"
ROOT = root_key("m")


def engine_hashes(ids: Sequence[int], size: int, salt: int = 0) -> list[int]:
    """Stand-in engine hashes: any distinct chained values do (we never reproduce them)."""
    out, parent = [], salt
    for i in range(len(ids) // size):
        parent = hash((parent, tuple(ids[i * size : (i + 1) * size]))) & (2**64 - 1)
        out.append(parent)
    return out


def stores(ids: Sequence[int], size: int, cuts: Sequence[int], medium: str = "GPU"
           ) -> list[dict[str, Any]]:
    """BlockStored events of ``ids`` in engine blocks of ``size``, split at block ``cuts``
    (chunked prefill), each after the first naming its parent."""
    hashes = engine_hashes(ids, size)
    bounds = [0, *cuts, len(hashes)]
    out = []
    for a, b in itertools.pairwise(bounds):
        out.append(block_stored(hashes[a:b], hashes[a - 1] if a else None,
                                ids[a * size : b * size], size, medium))
    return out


def as_stored(e: dict[str, Any]) -> Stored:
    payload = msgpack.packb([0.0, [e], 0])
    return decode_payload(payload)[1][0]  # type: ignore[return-value]


@pytest.mark.parametrize(("size", "cuts"), [(32, [3, 64 - 5]), (16, [1, 2, 40]), (48, [7]),
                                            (256, [2]), (512, [1])])
def test_tracker_keys_equal_token_chain(size: int, cuts: list[int]) -> None:
    rng = random.Random(size)
    ids = [rng.randrange(2048) for _ in range(size * (4096 // size) + size // 2)]
    tracker = ChainTracker(256)
    keys: list[int] = []
    for e in stores(ids, size, [c for c in cuts if c < len(ids) // size]):
        keys += tracker.store(as_stored(e), ROOT)
    full = len(ids) // size * size
    assert keys == token_chain(ids[:full], ROOT, 256)
    assert tracker.unresolved == 0


def test_removal_evicts_the_block_it_belonged_to() -> None:
    ids = list(range(1024))
    tracker = ChainTracker(256)
    [event] = stores(ids, 32, [])
    keys = tracker.store(as_stored(event), ROOT)
    hashes = event["block_hashes"]
    assert tracker.remove([hashes[9]]) == [keys[1]]  # tokens 288-319: our block 1
    assert tracker.remove([hashes[9], 12345]) == []
    assert tracker.remove([hashes[31], hashes[0]]) == [keys[3], keys[0]]


def test_unknown_parent_is_unresolved_and_memory_is_bounded() -> None:
    ids = list(range(2048))
    tracker = ChainTracker(256, max_blocks=10)
    first, second = stores(ids, 32, [8])
    assert tracker.store(as_stored(second), ROOT) == []  # its parent was never seen
    assert tracker.unresolved == 56
    assert len(tracker.store(as_stored(first), ROOT)) == 1
    assert len(tracker) == 10


def test_salt_roots_the_chain_and_multimodal_blocks_are_skipped() -> None:
    ids = list(range(512))
    [event] = stores(ids, 32, [])
    salted = {**event, "extra_keys": [["tenant-a"]] + [None] * 15}
    ingest_index = MemoryIndex()

    async def model_of(replica: str) -> str:
        return "m"

    async def run() -> None:
        ingest = KvIngest(ingest_index, model_of, block_tokens=256, max_blocks=100)
        [src] = parse_sources([R], ["tcp://127.0.0.1:1"])
        events = EngineEvents([src], ingest)
        state = events.states[R]
        await ingest.apply(state, msgpack.packb([0.0, [salted], 0]))
        mm = {**event, "block_hashes": [h + 1 for h in event["block_hashes"]],
              "extra_keys": [[["img", 0]]] + [None] * 15}
        await ingest.apply(state, msgpack.packb([0.0, [mm], 0]))
        assert ingest.tracker(R).unresolved == 16

    asyncio.run(run())
    salted_chain = token_chain(ids, root_key("m", "tenant-a", None), 256)
    assert ingest_index.lookup_now(salted_chain).gpu == {R: 2}
    assert ingest_index.lookup_now(token_chain(ids, ROOT, 256)).gpu == {}


class Publisher:
    """vLLM's wire format from a raw PUB socket (bound), optionally with a replay ROUTER."""

    def __init__(self, replay: bool = False) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.pub.bind(self.endpoint)
        self.sent: list[tuple[int, bytes]] = []
        self.replay_endpoint: str | None = None
        self._stop = threading.Event()
        if replay:
            self.replay_endpoint = f"tcp://127.0.0.1:{free_port()}"
            self._thread = threading.Thread(target=self._serve_replay, daemon=True)
            self._thread.start()

    def send(self, seq: int, events: list[Any], wire: bool = True) -> None:
        payload = msgpack.packb([1.0, events, 0])
        self.sent.append((seq, payload))
        if wire:
            self.pub.send_multipart([b"kv-events", seq.to_bytes(8, "big"), payload])

    def _serve_replay(self) -> None:  # vLLM's ZmqEventPublisher._service_replay
        sock = self.ctx.socket(zmq.ROUTER)
        assert self.replay_endpoint is not None
        sock.bind(self.replay_endpoint)
        while not self._stop.is_set():
            if not sock.poll(50):
                continue
            client, _, start = sock.recv_multipart()
            for seq, buf in self.sent:
                if seq >= int.from_bytes(start, "big"):
                    sock.send_multipart([client, b"", b"kv-events", seq.to_bytes(8, "big"), buf])
            sock.send_multipart([client, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])
        sock.close(0)

    def close(self) -> None:
        self._stop.set()
        if self.replay_endpoint is not None:
            self._thread.join(5)
        self.pub.close(0)
        self.ctx.term()


async def _model(replica: str) -> str:
    return "m"


class Rig:
    def __init__(self, pub: Publisher, block_tokens: int = 256) -> None:
        self.pub = pub
        self.index = MemoryIndex()
        replays = [pub.replay_endpoint] if pub.replay_endpoint else []
        self.events = EngineEvents(parse_sources([R], [pub.endpoint], replays),
                                   KvIngest(self.index, _model, block_tokens=block_tokens,
                                            max_blocks=10_000))

    async def settle(self, seq: int, timeout_s: float = 5.0) -> None:
        """Wait until batch ``seq`` was applied (SUB joins asynchronously: resend seq 0)."""
        state = self.events.states[R]
        async with asyncio.timeout(timeout_s):
            while state.last_seq != seq:
                await asyncio.sleep(0.01)

    def gpu(self, chain: Sequence[int]) -> int:
        return self.index.lookup_now(chain).gpu_blocks(R)


@pytest.fixture
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    pub = Publisher(replay=getattr(request, "param", False))
    r = Rig(pub)
    r.events.start()
    # A SUB misses what precedes its join: a no-op batch until it is through.
    state = r.events.states[R]
    async with asyncio.timeout(5):
        while state.batches == 0:
            pub.pub.send_multipart([b"kv-events", (0).to_bytes(8, "big"),
                                    msgpack.packb([0.0, [], 0])])
            await asyncio.sleep(0.05)
    pub.sent.append((0, msgpack.packb([0.0, [], 0])))
    yield r
    await r.events.stop()
    pub.close()


IDS = list(range(1000, 1000 + 1024))
CHAIN = token_chain(IDS, ROOT, 256)


def positional(e: dict[str, Any]) -> list[Any]:
    """The pre-#42892 encoding of a BlockStored map."""
    return ["BlockStored", e["block_hashes"], e["parent_block_hash"], e["token_ids"],
            e["block_size"], None, e["medium"], None]


async def test_both_encodings_store_and_remove(rig: Rig) -> None:
    first, second = stores(IDS, 32, [10])
    rig.pub.send(1, [first])
    rig.pub.send(2, [positional(second)])
    await rig.settle(2)
    assert rig.gpu(CHAIN) == 4
    assert rig.events.precise(R) and rig.events.status(R)["mode"] == "precise"
    rig.pub.send(3, [["BlockRemoved", [second["block_hashes"][20]], "GPU"]])  # tokens 960+
    await rig.settle(3)
    assert rig.gpu(CHAIN) == 3
    rig.pub.send(4, [block_removed([first["block_hashes"][0]], "GPU")])
    await rig.settle(4)
    assert rig.gpu(CHAIN) == 0


async def test_cpu_medium_is_the_pool_and_other_groups_are_skipped(rig: Rig) -> None:
    [gpu] = stores(IDS, 32, [])
    [cpu] = stores(IDS, 256, [], medium="cpu")
    mamba = {**gpu, "block_hashes": [h + 1 for h in gpu["block_hashes"]], "group_idx": 1,
             "kv_cache_spec_kind": "mamba"}
    rig.pub.send(1, [gpu, cpu, mamba])
    await rig.settle(1)
    found = rig.index.lookup_now(CHAIN)
    assert (found.gpu_blocks(R), found.pool) == (4, 4)
    rig.pub.send(2, [block_removed(cpu["block_hashes"][2:3], "cpu"),
                     {"type": "BlockRemoved", "block_hashes": gpu["block_hashes"][:1],
                      "medium": "GPU", "group_idx": 1}])
    await rig.settle(2)
    found = rig.index.lookup_now(CHAIN)
    assert (found.gpu_blocks(R), found.pool) == (4, 2)


async def test_restart_and_all_blocks_cleared_forget(rig: Rig) -> None:
    rig.pub.send(1, stores(IDS, 32, []))
    await rig.settle(1)
    rig.pub.send(0, [])  # the engine restarted: numbering starts again
    await rig.settle(0)
    assert rig.gpu(CHAIN) == 0 and rig.events.states[R].restarts == 1
    rig.pub.send(1, stores(IDS, 32, []))
    await rig.settle(1)
    assert rig.gpu(CHAIN) == 4
    rig.pub.send(2, [all_blocks_cleared()])
    await rig.settle(2)
    assert rig.gpu(CHAIN) == 0 and rig.events.states[R].cleared == 1


async def test_a_gap_without_replay_drops_the_stale_entries(rig: Rig) -> None:
    first, second = stores(IDS, 32, [16])
    rig.pub.send(1, [first])
    await rig.settle(1)
    assert rig.gpu(CHAIN) == 2
    rig.pub.send(2, [block_removed(first["block_hashes"][:1], "GPU")], wire=False)  # lost
    rig.pub.send(3, [second])
    await rig.settle(3)
    assert rig.events.states[R].gaps == 1
    assert rig.gpu(CHAIN) == 0  # forgotten; the lost parent makes the rest unresolvable
    assert rig.events.status(R)["unresolved_blocks"] == 16


@pytest.mark.parametrize("rig", [True], indirect=True)
async def test_a_gap_is_filled_from_the_replay_endpoint(rig: Rig) -> None:
    first, second = stores(IDS, 32, [16])
    rig.pub.send(1, [first])
    await rig.settle(1)
    rig.pub.send(2, [second], wire=False)  # lost on the PUB socket, kept for replay
    rig.pub.send(3, [block_removed(second["block_hashes"][-1:], "GPU")])
    await rig.settle(3)
    state = rig.events.states[R]
    assert (state.gaps, state.replayed) == (0, 1)
    assert rig.gpu(CHAIN) == 3


def test_sources_align_with_backends() -> None:
    a, b = "http://a:1", "http://b:2"
    by_order = parse_sources([a, b], ["tcp://h:1", "bind:tcp://127.0.0.1:2"], ["tcp://h:3", "tcp://h:4"])
    assert [(s.replica, s.endpoint, s.bind, s.replay) for s in by_order] == [
        (a, "tcp://h:1", False, "tcp://h:3"), (b, "tcp://127.0.0.1:2", True, "tcp://h:4")]
    by_url = parse_sources([a, b], [f"{b}/=tcp://h:9"])
    assert [(s.replica, s.endpoint, s.replay) for s in by_url] == [(b, "tcp://h:9", None)]
    for bad in (["tcp://h:1"], [f"{a}=tcp://h:1", "tcp://h:2"], ["http://c:3=tcp://h:1"]):
        with pytest.raises(ValueError):
            parse_sources([a, b], bad)


def test_emulated_replica_events_index_its_prompt(start_servers: Any) -> None:
    """sim/kv_events.py's publisher (8-token GPU blocks, 16-token pool chunks) ingested
    into 16-token keys equals token_chain over the replica's own /tokenize ids."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    server = start_servers(replica("--profile", "tiny", "--pool", "local", "--block-size", "8",
                                   "--kv-events-endpoint", endpoint, "--time-scale", "0.01"))
    index = MemoryIndex()

    async def run() -> list[int]:
        events = EngineEvents(parse_sources([server.url], [endpoint]),
                              KvIngest(index, _model_of_sim(server.url), block_tokens=16,
                                       max_blocks=10_000))
        events.start()
        try:
            return await send_until_precise(events, server.url)
        finally:
            await events.stop()

    ids = asyncio.run(run())
    # The last prompt sent carried " more" once less than the one tokenized here.
    chain = token_chain(ids, root_key("emulated-27b"), 16)
    found = index.lookup_now(chain)
    assert found.gpu_blocks(server.url) >= len(chain) - 1 >= 5
    assert found.pool >= len(chain) - 1


async def send_until_precise(events: EngineEvents, url: str) -> list[int]:
    """Send ever longer prompts to the emulated replica at ``url`` until ``events`` is
    precise for it (its SUB socket joins asynchronously); the last prompt's token ids, from
    the replica's /tokenize (the last prompt sent had one " more" less)."""
    prompt = "The shared pool keeps prefixes of long documents. " * 8
    async with httpx.AsyncClient(timeout=10) as client:
        async with asyncio.timeout(10):
            while not events.precise(url):
                body = {"model": "emulated-27b", "prompt": prompt, "max_tokens": 1}
                await client.post(url + "/v1/completions", json=body)
                prompt += " more"
                await asyncio.sleep(0.2)
        reply = await client.post(url + "/tokenize", json={"prompt": prompt})
    ids: list[int] = reply.json()["tokens"]
    return ids


def _model_of_sim(url: str) -> Any:
    async def model_of(replica: str) -> str:
        assert replica == url
        return "emulated-27b"
    return model_of


def make_tokenizer(root: Path, template: str) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(["hello world, the pool keeps prefixes"] * 50, trainer=trainer)
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": template}))
    return root


def test_chat_tokenizer_renders_the_template_like_the_engine(tmp_path: Path) -> None:
    template = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'bad' %}"
                "{{ raise_exception('no bad roles') }}{% endif %}<|{{ m['role'] }}|>"
                "{{ m['content'] }}{{ eos_token }}{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    tok = ChatTokenizer.from_dir(make_tokenizer(tmp_path, template))
    parts = [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]
    body = {"messages": [{"role": "user", "content": parts}]}
    assert tok.render_chat(body) == "<s><|user|>hello\nworld</s><|assistant|>"
    ids = tok.ids(body, "chat")
    assert ids[0] == 1 and 2 in ids  # <s> and </s> as their special ids
    assert tok.render_chat({**body, "add_generation_prompt": False}).endswith("</s>")
    assert tok.ids({"prompt": [5, 6, 7]}, "completions") == [5, 6, 7]
    with pytest.raises(TemplateFailed):
        tok.render_chat({"messages": [{"role": "bad", "content": "x"}]})


def test_settings_that_cannot_work_fail_at_start(tmp_path: Path) -> None:
    from router.app import create_app
    from router.settings import Settings

    with pytest.raises(ValueError, match="needs --tokenizer"):
        create_app(Settings(backends=("http://127.0.0.1:1",), kv_events=("tcp://127.0.0.1:2",)))
    with pytest.raises(ValueError, match=r"tokenizer\.json"):
        create_app(Settings(backends=("http://127.0.0.1:1",), tokenizer=str(tmp_path)))


def test_router_in_token_mode_learns_from_events(start_servers: Any, tmp_path: Path) -> None:
    """The router process: tokenizer, model discovery (/v1/models), /index/lookup, /replicas;
    events published by a raw PUB socket (bound here; the router connects)."""
    template = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    tok_dir = make_tokenizer(tmp_path, template)
    rep = start_servers(replica())
    pub = Publisher()
    try:
        lm = start_servers(router_server([rep.url], "--policy", "prefix_affinity",
                                         "--tokenizer", str(tok_dir),
                                         "--kv-events", f"{rep.url}={pub.endpoint}"))
        body = {"model": "emulated-27b",
                "messages": [{"role": "user", "content": "hello world " * 200}]}
        ids = ChatTokenizer.from_dir(tok_dir).ids(body, "chat")
        [event] = stores(ids, 32, [])
        found: dict[str, Any] = {}
        for seq in range(200):  # the SUB joins asynchronously: resend until it is through
            pub.send(seq, [event])
            found = httpx.post(lm.url + "/index/lookup", json=body).json()
            if found["gpu"]:
                break
        assert found["chain_blocks"] == len(ids) // 256 >= 2
        assert found["gpu"] == {rep.url: found["chain_blocks"]}
        [status] = httpx.get(lm.url + "/replicas").json()["replicas"]
        assert status["index"]["mode"] == "precise"
        assert status["index"]["unresolved_blocks"] == 0
    finally:
        pub.close()


def test_in_token_mode_the_policy_sees_the_prompt_in_the_index_s_tokens(tmp_path: Path) -> None:
    """The cost model splits a prompt into cached and new tokens with the index's blocks:
    in token mode its length is the tokenizer's count, not the text's length / 4 (random
    or non-English text is far from 4 characters a token: here 3,000 characters are 3,000
    tokens, and the split would have mixed the index's 2,816 cached tokens with a
    750-token prompt)."""
    import time

    from router.locator import Locator
    from router.metrics import RouterMetrics
    from router.openai_api import parse_request
    from router.replicas import ReplicaSet
    from router.upstream import Upstream

    tok = ChatTokenizer.from_dir(make_tokenizer(tmp_path, "{{ messages[0]['content'] }}"))
    reps = ReplicaSet(["http://p"], Upstream(connect_timeout_s=1.0, first_byte_timeout_s=1.0),
                      health_interval_s=1.0, health_timeout_s=1.0, eject_after=3,
                      readmit_after=1, scrape_interval_s=1.0, clock=time.monotonic)
    body = {"model": "m", "messages": [{"role": "user", "content": "zq xv " * 500}]}
    raw = json.dumps(body).encode()
    ids = tok.ids(body, "chat")
    token_mode = Locator(MemoryIndex(), RouterMetrics(reps), block_bytes=1024,
                         pool_write_through=False, tokenizer=tok, block_tokens=256)
    chain, tokens = token_mode.prompt_chain(parse_request("chat", raw, None))
    assert tokens == len(ids) and len(chain) == len(ids) // 256
    assert abs(tokens - 3000 // 4) > 0.5 * tokens  # what the text's length said
    text_mode = Locator(MemoryIndex(), RouterMetrics(reps), block_bytes=1024,
                        pool_write_through=False)
    assert text_mode.prompt_chain(parse_request("chat", raw, None))[1] == 3000 // 4
