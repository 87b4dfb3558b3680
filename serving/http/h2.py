"""HTTP/2's wire (RFC 9113) as far as a unary gRPC server needs it: frame headers, the few header
blocks a server sends, and the decoding of the blocks it receives.

A server's own header blocks are written once as HPACK literals that touch no dynamic table (RFC 7541
§6.2.2), so answering costs no encoder state; received blocks are decoded by `hpack` (python-hyper),
and a block made only of indexed fields, which a client repeats call after call once its table holds
them, is decoded once per table state (`HeaderBlocks`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Generic, TypeVar

import hpack

Head = TypeVar("Head")

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# frame types (§6)
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE = range(9)
CONTINUATION: Final = 9

# flags
END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20

# error codes (§7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x5, 0x6, 0x7, 0x8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB

# settings (§6.5.2)
HEADER_TABLE_SIZE, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE = 0x1, 0x3, 0x4
MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x5, 0x6

DEFAULT_WINDOW: Final = 65_535
DEFAULT_FRAME_SIZE: Final = 16_384
MAX_WINDOW: Final = 2**31 - 1
MAX_FRAME_SIZE_LIMIT: Final = 2**24 - 1


class PeerError(Exception):
    """The peer broke the protocol: the connection ends with GOAWAY carrying `code`."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One frame: its 9-byte header, then `payload`."""
    return frame_header(kind, flags, stream, len(payload)) + payload


def frame_header(kind: int, flags: int, stream: int, length: int) -> bytes:
    return length.to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big")


def settings(pairs: dict[int, int]) -> bytes:
    body = b"".join(
        key.to_bytes(2, "big") + value.to_bytes(4, "big") for key, value in pairs.items()
    )
    return frame(SETTINGS, 0, 0, body)


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    if len(payload) % 6:
        raise PeerError(FRAME_SIZE_ERROR, "a SETTINGS frame's length is not a multiple of 6")
    return [
        (
            int.from_bytes(payload[at : at + 2], "big"),
            int.from_bytes(payload[at + 2 : at + 6], "big"),
        )
        for at in range(0, len(payload), 6)
    ]


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, increment.to_bytes(4, "big"))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, code.to_bytes(4, "big"))


def goaway(last_stream: int, code: int, reason: str = "") -> bytes:
    body = last_stream.to_bytes(4, "big") + code.to_bytes(4, "big") + reason.encode()[:256]
    return frame(GOAWAY, 0, 0, body)


def _integer(value: int, prefix_bits: int) -> bytes:
    """An HPACK integer (RFC 7541 §5.1) whose first byte's high bits are zero."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((value,))
    out = bytearray((limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal with a new name, never indexed by either side's table (§6.2.2)."""
    return b"\x00" + _integer(len(name), 7) + name + _integer(len(value), 7) + value


# `:status: 200` (static index 8) and `content-type: application/grpc` (name at static index 31)
STATUS_200: Final = b"\x88"
CONTENT_TYPE_GRPC: Final = b"\x0f\x10" + _integer(16, 7) + b"application/grpc"


def status_only(status: int) -> bytes:
    """The header block of an HTTP answer that is no gRPC call's (a wrong method or content type)."""
    return b"\x08\x03" + str(status).encode()  # `:status` by its static index 8, literal value


# the bytes of `hpack`'s single-byte indexed fields (indices 1-126): a block made only of them
# changes no table (RFC 7541 §6.1)
_INDEXED = bytes(range(0x81, 0xFF))

Fields = tuple[tuple[bytes, bytes], ...]


class HeaderBlocks(Generic[Head]):
    """One connection's HPACK decoder, whose blocks are read by `read`; a block that changes no table
    is decoded and read once per table state.

    A block that is not purely indexed may add to the dynamic table (or resize it), which changes what
    the indices of later blocks mean: it empties the cache."""

    CACHED_BLOCKS: Final = 64

    def __init__(self, max_header_list_size: int, read: Callable[[Fields], Head]) -> None:
        self.decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
        self.read = read
        self.cache: dict[bytes, Head] = {}

    def decode(self, block: bytes) -> Head:
        """The block as `read` reads its fields, or PeerError for a block hpack cannot decode
        (the table state is then lost, RFC 7541 §4.3) or one over the header list's limit."""
        known = self.cache.get(block)
        if known is not None:
            return known
        try:
            fields = self.decoder.decode(block, raw=True)
        except hpack.OversizedHeaderListError as error:
            raise PeerError(ENHANCE_YOUR_CALM, f"header list too large: {error}") from error
        except hpack.HPACKError as error:
            raise PeerError(COMPRESSION_ERROR, f"undecodable header block: {error}") from error
        head = self.read(tuple(fields))
        if block.translate(None, _INDEXED):
            self.cache.clear()
        elif len(self.cache) < self.CACHED_BLOCKS:
            self.cache[block] = head
        return head


Payload = TypeVar("Payload", bytes, memoryview)


def unpad(flags: int, payload: Payload) -> Payload:
    """A DATA or HEADERS payload without its padding (§6.1)."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise PeerError(PROTOCOL_ERROR, "padding longer than its frame")
    return payload[1 : len(payload) - payload[0]]
