"""The kubelet's image pull, without a kubelet: one CRI call, ImageService/PullImage
(k8s.io/cri-api runtime/v1), to containerd's socket, as the kubelet makes it for a pod's image.

grpcio is not a dependency of the project and crictl is not packaged in Debian 12, so this
speaks the few bytes of gRPC the one call needs: HTTP/2 with prior knowledge over the unix
socket (RFC 9113), request headers as HPACK literals (RFC 7541, no Huffman, no table), one
length-prefixed protobuf message each way. A failed call carries its reason only in the
response trailers, which the server HPACK-compresses; the caller reads containerd's log for it
(containerd logs every failed CRI call with its error)."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4


class CriError(Exception):
    """The call ended without a response message (the pull failed)."""


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _hpack_int(n: int) -> bytes:
    """An HPACK integer with a 7-bit prefix (a string length, the H bit 0: no Huffman)."""
    if n < 0x7F:
        return bytes([n])
    out, n = [0x7F], n - 0x7F
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n])


def _literal(name: str, value: str) -> bytes:
    """A header field as a literal without indexing, its name new (RFC 7541 6.2.2)."""
    return b"\x00" + b"".join(_hpack_int(len(s)) + s for s in (name.encode(), value.encode()))


def _field(number: int, value: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2) of fewer than 2**14 bytes."""
    n = len(value)
    assert n < 1 << 14, n
    length = bytes([n]) if n < 0x80 else bytes([n & 0x7F | 0x80, n >> 7])
    return bytes([number << 3 | 2]) + length + value


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = buf[i]
        n |= (b & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not b & 0x80:
            return n, i


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise CriError("containerd closed the connection")
        buf += chunk
    return buf


def pull_image(runtime_socket: Path, image: str, timeout: float = 600) -> str:
    """PullImageRequest{image: ImageSpec{image}} to the CRI socket; the image_ref of its
    response: the image ID (its config digest, sha256:...) that the kubelet records."""
    message = _field(1, _field(1, image.encode()))  # PullImageRequest.image (ImageSpec).image
    headers = b"".join(_literal(k, v) for k, v in [
        (":method", "POST"), (":scheme", "http"), (":path", "/runtime.v1.ImageService/PullImage"),
        (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers")])
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(runtime_socket))
        sock.sendall(PREFACE + _frame(SETTINGS, 0, 0, b"")
                     + _frame(HEADERS, END_HEADERS, 1, headers)
                     + _frame(DATA, END_STREAM, 1, b"\x00" + struct.pack(">I", len(message)) + message))
        body = b""
        while True:
            head = _recv_exact(sock, 9)
            length, kind, flags, stream = int.from_bytes(head[:3], "big"), head[3], head[4], \
                struct.unpack(">I", head[5:])[0] & 0x7FFFFFFF
            payload = _recv_exact(sock, length)
            if kind == SETTINGS and not flags & ACK:
                sock.sendall(_frame(SETTINGS, ACK, 0, b""))
            elif kind == PING and not flags & ACK:
                sock.sendall(_frame(PING, ACK, 0, payload))
            elif kind == GOAWAY or (kind == RST_STREAM and stream == 1):
                raise CriError(f"containerd ended the call ({'GOAWAY' if kind == GOAWAY else 'RST_STREAM'})")
            elif kind == DATA and stream == 1:
                body += payload
            if stream == 1 and kind in (DATA, HEADERS) and flags & END_STREAM:
                break
    if len(body) < 5:
        raise CriError(f"PullImage {image}: no response message (the pull failed; containerd's log says why)")
    size = struct.unpack(">I", body[1:5])[0]
    response = body[5:5 + size]  # PullImageResponse{image_ref = 1}
    if not response or response[0] != (1 << 3 | 2):
        raise CriError(f"PullImage {image}: unexpected response {response!r}")
    n, i = _read_varint(response, 1)
    return response[i:i + n].decode()
