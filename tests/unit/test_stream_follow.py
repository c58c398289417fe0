"""How the controller follows a running session's stream: each poll reads the capture volume's
stream to its end as it is then, in chunk-sized execs, and stops at the first short chunk.

It used to read until a chunk came back empty, so a stream that grew while it was read was
chased an exec at a time: bench/scale.py counted 54 execs per session at 100 sessions at once,
where 60 s sessions polled every 15 s need about 10."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from runner.executors.kubernetes import KubernetesExecutor
from runner.k8s.api import ExecResult, Tally
from runner.retry import RetryPolicy
from runner.settings import KubeSettings, Settings


class GrowingStream:
    """A reader container whose stream grows by ``grow`` bytes after every exec (a CLI that
    writes while it is read), up to ``limit`` bytes."""

    def __init__(self, start: int, grow: int, limit: int):
        self.data = bytes(i % 251 for i in range(limit))
        self.size, self.grow, self.limit = start, grow, limit
        self.execs: list[tuple[int, int]] = []
        self.retry = RetryPolicy(lambda e: False, 1, 0)
        self.tally = Tally()

    def exec(self, pod, container, argv, stdin=None, timeout=60.0) -> ExecResult:
        offset, length = int(argv[-3]), int(argv[-2])
        self.execs.append((offset, length))
        out = self.data[offset:min(self.size, offset + length)]
        self.size = min(self.limit, self.size + self.grow)
        return ExecResult(out, b"", 0)


def _executor(kube: GrowingStream, chunk: int) -> KubernetesExecutor:
    settings = Settings(kube=KubeSettings(namespace="ns", transfer_chunk_bytes=chunk))
    return KubernetesExecutor(settings, kube)  # type: ignore[arg-type]  # only exec and retry are used


def test_a_poll_reads_a_growing_stream_to_its_end_as_it_was_and_no_further(tmp_path):
    kube = GrowingStream(start=300, grow=100, limit=100_000)
    spool = tmp_path / "stream.spool"
    got = _executor(kube, 4096)._fetch("pod", spool, 0, None)
    assert kube.execs == [(0, 4096)]  # before: about a thousand, chasing it 100 bytes at a time to its limit
    assert got == 300 and spool.read_bytes() == kube.data[:300]
    # the next poll goes on from there
    got = _executor(kube, 4096)._fetch("pod", spool, got, None)
    assert kube.execs[1:] == [(300, 4096)] and got == 400 and spool.read_bytes() == kube.data[:400]


def test_a_poll_reads_a_stream_longer_than_a_chunk_in_whole_chunks(tmp_path):
    kube = GrowingStream(start=10_000, grow=0, limit=10_000)
    spool = tmp_path / "stream.spool"
    got = _executor(kube, 4096)._fetch("pod", spool, 0, None)
    assert kube.execs == [(0, 4096), (4096, 4096), (8192, 4096)]
    assert got == 10_000 and spool.read_bytes() == kube.data


def test_the_last_fetch_reads_to_the_readers_count_whatever_the_chunks(tmp_path):
    """After the harness's end the reader has recorded the stream's length: the fetch reads to
    exactly that, short chunks or not."""
    kube = GrowingStream(start=5000, grow=3000, limit=12_000)
    spool = tmp_path / "stream.spool"
    got = _executor(kube, 4096)._fetch("pod", spool, 0, 12_000)
    assert got == 12_000 and spool.read_bytes() == kube.data
    assert kube.execs == [(0, 4096), (4096, 4096), (8000, 4000), (11000, 1000)]


class StalledNode(GrowingStream):
    """Every exec stalls, as to a pod on a lost node, until the test lets them go."""

    def __init__(self) -> None:
        super().__init__(start=0, grow=0, limit=0)
        self.go = threading.Event()
        self.lock = threading.Lock()
        self.now = self.most = 0

    def exec(self, pod, container, argv, stdin=None, timeout=60.0) -> ExecResult:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        self.go.wait(10)
        with self.lock:
            self.now -= 1
        return ExecResult(b"", b"", 0)


class NoEnd:
    """A pod cache whose harnesses never end (each wait lasts its timeout) but those the test ends."""

    def __init__(self) -> None:
        self.ended: set[str] = set()

    def get(self, name):
        harness = {"name": "harness", "state": {"terminated": {"exitCode": 0}} if name in self.ended else {"running": {}}}
        return {"metadata": {"name": name}, "status": {"phase": "Running", "containerStatuses": [harness]}}

    async def wait(self, name, until, timeout):
        await asyncio.sleep(timeout)
        return until(self.get(name))


def test_stalled_follows_take_at_most_half_the_runs_threads(tmp_path):
    """Issue 32, item 1: sessions wait on one event loop and their requests run on a bounded pool
    (io_threads). A lost node's pods stall their follows up to the exec's deadlines; those take
    at most half the pool, so the rest is left to every other session's start, end and journal,
    and a session whose follow waits its turn still sees its harness's end."""
    kube = StalledNode()
    settings = Settings(io_threads=4, kube=KubeSettings(namespace="ns", stream_poll_seconds=0.05))
    executor = KubernetesExecutor(settings, kube)  # type: ignore[arg-type]  # only exec and retry are used
    cache = executor.cache = NoEnd()  # type: ignore[assignment]

    async def scenario() -> None:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=settings.io_threads))
        follows = [asyncio.create_task(executor._follow(f"pod-{i}", tmp_path / f"{i}.spool", 4.0)) for i in range(6)]
        await asyncio.sleep(1.5)  # thirty polls each, and each waiting follow has looked for its end
        assert kube.most == 2, f"{kube.most} follows in flight, of a pool of 4"
        # the other half is free: a session's start or end runs at once
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "delivered"), 1) == "delivered"
        cache.ended.add("pod-5")  # its harness ends while its follow waits its turn behind the stalled ones
        end, _ = await asyncio.wait_for(follows[5], 2)
        assert end is not None and end.terminated == {"exitCode": 0} and kube.now == 2
        kube.go.set()
        assert [end for end, _ in await asyncio.gather(*follows[:5])] == [None] * 5  # each to its limit, none lost

    asyncio.run(scenario())
