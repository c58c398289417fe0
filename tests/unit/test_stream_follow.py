"""How the controller follows a running session's stream: each poll reads the capture volume's
stream to its end as it is then, in chunk-sized execs, and stops at the first short chunk.

It used to read until a chunk came back empty, so a stream that grew while it was read was
chased an exec at a time: bench/scale.py counted 54 execs per session at 100 sessions at once,
where 60 s sessions polled every 15 s need about 10."""

from __future__ import annotations

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
