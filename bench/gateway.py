"""What the provider gateway (runner/gateway/server.py) adds beside a direct connection to the
provider (issue 15, item 2), measured in one run:

1. per request: small Messages answers one after another, direct and through the gateway
   (the gateway checks the token, forwards, meters, streams back);
2. per streamed byte: one large event stream, direct and through the gateway;
3. at many concurrent streaming sessions (500 by default): every session streams a paced
   answer at once; the time to the first byte and to the end, and the errors, both ways.

The upstream is an aiohttp server answering like the Messages API (server-sent events with
message_start/message_delta usage); it, the gateway and the clients each run in their own
process on loopback, as they would on separate hosts, but share this machine's cores.

    python bench/gateway.py                     # 2000 requests, 256 MiB stream, 500 sessions
    python bench/gateway.py --quick             # a smaller run to check it works
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402

MODEL = "claude-sonnet-4-5-20250929"
START = ('event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","model":"' + MODEL
         + '","usage":{"input_tokens":1200,"output_tokens":1}}}\n\n').encode()
END = (b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":80}}'
       b'\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n')


def _delta(size: int) -> bytes:
    text = "x" * max(size - 120, 1)
    return ('event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
            f'"text":"{text}"}}}}\n\n').encode()


async def _answer(request: web.Request) -> web.StreamResponse:
    """The first message says ``events=N&size=B&pace=S``: N deltas of about B bytes, S seconds apart."""
    spec = dict(urllib.parse.parse_qsl(json.loads(await request.read())["messages"][0]["content"]))
    n = int(spec.get("events", "3"))
    size = int(spec.get("size", "200"))
    pace = float(spec.get("pace", "0"))
    resp = web.StreamResponse(headers={"content-type": "text/event-stream", "request-id": "req_bench"})
    await resp.prepare(request)
    await resp.write(START)
    chunk = _delta(size)
    for _ in range(n):
        if pace:
            await asyncio.sleep(pace)
        await resp.write(chunk)
    await resp.write(END)
    await resp.write_eof()
    return resp


def _serve(app: web.Application, port_out: multiprocessing.Queue) -> None:
    """Serve ``app`` on a free loopback port (said on ``port_out``) until the process ends."""
    async def main() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=2048)
        await site.start()
        port_out.put(runner.addresses[0][1])
        await asyncio.Event().wait()
    asyncio.run(main())


def _serve_upstream(port_out: multiprocessing.Queue) -> None:
    app = web.Application()
    app.router.add_post("/v1/messages", _answer)
    _serve(app, port_out)


def _serve_gateway(upstream: str, secret: bytes, port_out: multiprocessing.Queue) -> None:
    import logging

    from runner.gateway.server import Gateway
    from runner.settings import DEFAULT_PRICES

    logging.disable(logging.INFO)  # one log line per request is the product's; not what is timed here
    _serve(Gateway(upstream, "bench-key", secret, DEFAULT_PRICES, campaigns=["bench"]).app(), port_out)


def serve_upstream_and_gateway(secret: bytes) -> tuple[list[multiprocessing.process.BaseProcess], str, str]:
    """The upstream and a gateway in front of it (checking tokens signed with ``secret``), each
    in its own process: (the processes, the upstream's URL, the gateway's URL)."""
    ctx = multiprocessing.get_context("spawn")
    q: multiprocessing.Queue = ctx.Queue()
    up = ctx.Process(target=_serve_upstream, args=(q,), daemon=True)
    up.start()
    upstream = f"http://127.0.0.1:{q.get(timeout=60)}"
    gw = ctx.Process(target=_serve_gateway, args=(upstream, secret, q), daemon=True)
    gw.start()
    return [up, gw], upstream, f"http://127.0.0.1:{q.get(timeout=60)}"


async def _one(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> tuple[float, float, int]:
    """(time to the first byte, time to the end, bytes) of one streamed answer. ``url``'s query
    is the answer's spec (see _answer), sent in the request's message as a CLI request would be
    shaped: the gateway passes on only the CLI's query string."""
    base, _, spec = url.partition("?")
    body = json.dumps({"model": MODEL, "max_tokens": 1024, "stream": True,
                       "messages": [{"role": "user", "content": spec}]}).encode()
    t0 = time.perf_counter()
    first = None
    n = 0
    async with session.post(base + "?beta=true", data=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
        async for chunk in resp.content.iter_any():
            if first is None:
                first = time.perf_counter() - t0
            n += len(chunk)
    return first or 0.0, time.perf_counter() - t0, n


async def _sequential(url: str, headers: dict[str, str], count: int) -> list[float]:
    async with aiohttp.ClientSession() as s:
        for _ in range(20):  # warm-up: connections, the gateway's pool
            await _one(s, url, headers)
        return [(await _one(s, url, headers))[1] for _ in range(count)]


async def _stream(url: str, headers: dict[str, str]) -> tuple[float, int]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as s:
        _, took, n = await _one(s, url, headers)
        return took, n


async def _concurrent(url: str, headers: dict[str, str], sessions: int) -> tuple[list[float], list[float], int]:
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as s:
        results = await asyncio.gather(*(_one(s, url, headers) for _ in range(sessions)), return_exceptions=True)
    ok = [r for r in results if not isinstance(r, BaseException)]
    return [r[0] for r in ok], [r[1] for r in ok], len(results) - len(ok)


def _p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--stream-mib", type=int, default=256)
    ap.add_argument("--sessions", type=int, default=500)
    ap.add_argument("--quick", action="store_true", help="200 requests, 32 MiB, 100 sessions")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.stream_mib, args.sessions = 200, 32, 100

    from runner.gateway import tokens

    secret = tokens.new_secret()
    (up, gw), upstream, gateway = serve_upstream_and_gateway(secret)
    token = tokens.mint(secret, tokens.Claims("bench", "P", "s", 1, int(time.time() + 3600)))
    direct_h, via_h = {"x-api-key": "bench-key"}, {"x-api-key": token}
    try:
        small = "/v1/messages?events=3&size=200"
        d = asyncio.run(_sequential(upstream + small, direct_h, args.requests))
        g = asyncio.run(_sequential(gateway + small, via_h, args.requests))
        print(f"1. {args.requests} small streamed answers one after another (p50, p90 of the whole request):")
        print(f"   direct  {1000 * _p(d, 50):.3f} ms, {1000 * _p(d, 90):.3f} ms")
        print(f"   gateway {1000 * _p(g, 50):.3f} ms, {1000 * _p(g, 90):.3f} ms")
        print(f"   added per request: {1000 * (_p(g, 50) - _p(d, 50)):.3f} ms at p50; ratio {_p(g, 50) / _p(d, 50):.2f}x")

        size = 16 * 1024
        events = args.stream_mib * 1024 * 1024 // size
        big = f"/v1/messages?events={events}&size={size}"
        dt, dn = asyncio.run(_stream(upstream + big, direct_h))
        gt, gn = asyncio.run(_stream(gateway + big, via_h))
        assert dn == gn, (dn, gn)
        print(f"2. one stream of {dn / 2**20:.0f} MiB in {size // 1024} KiB events:")
        print(f"   direct  {dn / dt / 2**20:.0f} MiB/s; gateway {gn / gt / 2**20:.0f} MiB/s")
        print(f"   added per streamed MiB: {1000 * (gt / gn - dt / dn) * 2**20:.3f} ms; ratio {gt / dt:.2f}x")

        paced = "/v1/messages?events=40&size=400&pace=0.05"  # about 2 s and 16 KiB each, as a short answer streams
        df, de, derr = asyncio.run(_concurrent(upstream + paced, direct_h, args.sessions))
        gf, ge, gerr = asyncio.run(_concurrent(gateway + paced, via_h, args.sessions))
        print(f"3. {args.sessions} concurrent streaming sessions (40 events 50 ms apart):")
        print(f"   direct  first byte p50 {1000 * _p(df, 50):.1f} ms p99 {1000 * _p(df, 99):.1f} ms; "
              f"whole p50 {_p(de, 50):.3f} s p99 {_p(de, 99):.3f} s; errors {derr}")
        print(f"   gateway first byte p50 {1000 * _p(gf, 50):.1f} ms p99 {1000 * _p(gf, 99):.1f} ms; "
              f"whole p50 {_p(ge, 50):.3f} s p99 {_p(ge, 99):.3f} s; errors {gerr}")
        print(f"   ratio of the whole stream at p99: {_p(ge, 99) / _p(de, 99):.2f}x")
    finally:
        gw.terminate()
        up.terminate()


if __name__ == "__main__":
    main()
