"""HPACK (RFC 7541), the header compression of HTTP/2: what :mod:`.http2` needs.

Why our own: the ``hpack`` package keeps 1.2 MB resident (its Huffman tables as
Python objects), more than the daemon's whole idle-memory margin (README
"Benchmarks"). What we need is narrow: requests are encoded as literals without
indexing and without Huffman (always allowed, and our few request headers are short),
so the encoder keeps no state; answers are decoded in full (the dynamic table, Huffman
strings, table size updates), because the server chooses how it compresses.

The Huffman code of Appendix B is canonical (codes of one length are consecutive, in
symbol order, shorter lengths first), so the code lengths alone define it; decoding
walks it four bits at a time through a 256-state table built at first use.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable

STATIC_TABLE: tuple[tuple[str, str], ...] = (
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
)
"""Appendix A; index 1 is the first entry."""

HUFFMAN_CODE_LENGTHS = bytes.fromhex(
    "0d171c1c1c1c1c1c1c181e1c1c1e1c1c1c1c1c1c1c1c1e1c1c1c1c1c1c1c1c1c"
    "060a0a0c0d06080b0a0a080b080606060505050606060606060607080f060c0a"
    "0d06070707070707070707070707070707070707070707070807080d130d0e06"
    "0f05060506050606060507070606060506070605050607070707070f0b0e0d1c"
    "141614141616161716171717171718171818161718171717171516171617171816"
    "151416161717151716161815161717151516151716171714161616171616171a"
    "1a1413161716191a1a1a1b1b1a181913151a1b1b1a1b1815151a1a1c1b1b1b14"
    "181415161515171616191918181a171a1b1a1a1b1b1b1b1b1c1b1b1b1b1b1a1e"
)
"""Bit length of the Huffman code of each symbol 0-255 and EOS (256), Appendix B."""

EOS = 256
DEFAULT_TABLE_SIZE = 4096
MAX_STRING = 1 << 20
"""No header name or value we accept is longer (the server sends a few hundred bytes)."""


class HpackError(Exception):
    """A header block that breaks RFC 7541: the connection cannot go on."""


class _Huffman:
    """Decoding tables: for state s (an inner node of the code tree, the root is 0)
    and nibble n, ``next[s*16+n]`` is the node reached and ``emit[s*16+n]`` the symbol
    completed on the way (-1 none; min code length 5 > 4, so at most one)."""

    def __init__(self, lengths: bytes) -> None:
        order = sorted(range(len(lengths)), key=lambda s: (lengths[s], s))
        # The tree as child arrays; leaves are stored as -1 - symbol.
        left: list[int] = [0]
        right: list[int] = [0]
        code, prev = -1, lengths[order[0]]
        for sym in order:
            code = (code + 1) << (lengths[sym] - prev)
            prev = lengths[sym]
            node = 0
            for shift in range(lengths[sym] - 1, -1, -1):
                side = right if (code >> shift) & 1 else left
                if shift == 0:
                    side[node] = -1 - sym
                    break
                if side[node] == 0:
                    left.append(0)
                    right.append(0)
                    side[node] = len(left) - 1
                node = side[node]
        self.next = array("H", bytes(2 * 16 * len(left)))
        self.emit = array("h", [-1]) * (16 * len(left))
        for state in range(len(left)):
            for nibble in range(16):
                node, emit = state, -1
                for shift in (3, 2, 1, 0):
                    child = (right if (nibble >> shift) & 1 else left)[node]
                    if child < 0:
                        emit, node = -1 - child, 0
                    else:
                        node = child
                self.next[state * 16 + nibble] = node
                self.emit[state * 16 + nibble] = emit
        # A string ends in padding: a prefix of EOS (all ones) shorter than 8 bits, so
        # the walk may stop only at the root or on the all-ones path within depth 7.
        self.accepting = {0}
        node = 0
        for _ in range(7):
            node = right[node]
            self.accepting.add(node)

    def decode(self, data: bytes) -> bytes:
        nxt, emit = self.next, self.emit
        out = bytearray()
        state = 0
        for byte in data:
            i = (state << 4) | (byte >> 4)
            sym = emit[i]
            if sym >= 0:
                if sym == EOS:
                    raise HpackError("EOS symbol inside a Huffman string")
                out.append(sym)
            i = (nxt[i] << 4) | (byte & 15)
            sym = emit[i]
            if sym >= 0:
                if sym == EOS:
                    raise HpackError("EOS symbol inside a Huffman string")
                out.append(sym)
            state = nxt[i]
        if state not in self.accepting:
            raise HpackError("Huffman string padded with other than 1 bits or 8 or more")
        return bytes(out)


def _encode_int(value: int, prefix_bits: int, first: int) -> bytearray:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytearray((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return out


def encode(headers: Iterable[tuple[str, str]]) -> bytes:
    """A header block of literals without indexing (name by static index where one
    exists): the decoder's table never changes, so this side keeps no state."""
    out = bytearray()
    for name, value in headers:
        index = _STATIC_NAMES.get(name, 0)
        out += _encode_int(index, 4, 0x00)
        if not index:
            raw = name.encode("latin-1")
            out += _encode_int(len(raw), 7, 0x00) + raw
        raw = value.encode("latin-1")
        out += _encode_int(len(raw), 7, 0x00) + raw
    return bytes(out)


_STATIC_NAMES = {name: i for i, (name, _) in reversed(list(enumerate(STATIC_TABLE, 1)))}
"""Each name's first static index."""


class Decoder:
    """The decoding side of one connection (its dynamic table). Not thread-safe: header
    blocks must be decoded in the order they arrive."""

    def __init__(self, max_table_size: int = DEFAULT_TABLE_SIZE) -> None:
        self._limit = max_table_size  # what we told the peer (SETTINGS_HEADER_TABLE_SIZE)
        self._max = max_table_size
        self._size = 0
        self._table: deque[tuple[str, str]] = deque()
        self._huffman: _Huffman | None = None

    def _evict(self) -> None:
        while self._size > self._max:
            name, value = self._table.pop()
            self._size -= len(name) + len(value) + 32

    def _entry(self, index: int) -> tuple[str, str]:
        if 1 <= index <= len(STATIC_TABLE):
            return STATIC_TABLE[index - 1]
        dyn = index - len(STATIC_TABLE) - 1
        if 0 <= dyn < len(self._table):
            return self._table[dyn]
        raise HpackError(f"header index {index} is not in the table")

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        """The block's headers in order (names and values as latin-1 text)."""
        out: list[tuple[str, str]] = []
        pos, end = 0, len(block)
        seen_field = False
        while pos < end:
            byte = block[pos]
            if byte & 0x80:  # indexed field
                index, pos = self._int(block, pos, 7)
                out.append(self._entry(index))
                seen_field = True
            elif byte & 0x40:  # literal with incremental indexing
                name, value, pos = self._literal(block, pos, 6)
                out.append((name, value))
                self._table.appendleft((name, value))
                self._size += len(name) + len(value) + 32
                self._evict()
                seen_field = True
            elif byte & 0x20:  # dynamic table size update
                if seen_field:
                    raise HpackError("table size update after a header field")
                size, pos = self._int(block, pos, 5)
                if size > self._limit:
                    raise HpackError(f"table size update to {size} above our {self._limit}")
                self._max = size
                self._evict()
            else:  # literal without indexing (0000) or never indexed (0001)
                name, value, pos = self._literal(block, pos, 4)
                out.append((name, value))
                seen_field = True
        return out

    def _literal(self, block: bytes, pos: int, prefix_bits: int) -> tuple[str, str, int]:
        index, pos = self._int(block, pos, prefix_bits)
        if index:
            name = self._entry(index)[0]
        else:
            name, pos = self._string(block, pos)
        value, pos = self._string(block, pos)
        return name, value, pos

    def _string(self, block: bytes, pos: int) -> tuple[str, int]:
        if pos >= len(block):
            raise HpackError("header block ends before a string")
        huffman = block[pos] & 0x80
        length, pos = self._int(block, pos, 7)
        if length > MAX_STRING or pos + length > len(block):
            raise HpackError(f"string of {length} bytes runs past the header block")
        raw = block[pos : pos + length]
        if huffman:
            if self._huffman is None:  # about 5 ms and 24 KB, once per connection
                self._huffman = _Huffman(HUFFMAN_CODE_LENGTHS)
            raw = self._huffman.decode(raw)
        return raw.decode("latin-1"), pos + length

    @staticmethod
    def _int(block: bytes, pos: int, prefix_bits: int) -> tuple[int, int]:
        limit = (1 << prefix_bits) - 1
        value = block[pos] & limit
        pos += 1
        if value < limit:
            return value, pos
        shift = 0
        while True:
            if pos >= len(block):
                raise HpackError("header block ends inside an integer")
            byte = block[pos]
            pos += 1
            value += (byte & 127) << shift
            if not byte & 128:
                return value, pos
            shift += 7
            if shift > 28:
                raise HpackError("integer longer than 2^28 in a header block")
