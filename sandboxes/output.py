"""Bounded capture of a command's output: the head and the tail are kept, the middle dropped."""

from __future__ import annotations

from collections import deque


class CappedBuffer:
    """Keeps the first and last `limit_bytes // 2` bytes of a stream and counts the rest."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = int(limit_bytes)
        self._head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self.total_bytes = 0

    @property
    def truncated(self) -> bool:
        return self.total_bytes > self.limit_bytes

    def append(self, chunk: bytes) -> None:
        self.total_bytes += len(chunk)
        head_room = self.limit_bytes // 2 - len(self._head)
        if head_room > 0:
            self._head += chunk[:head_room]
            chunk = chunk[head_room:]
        if not chunk:
            return
        tail_limit = self.limit_bytes - self.limit_bytes // 2
        self._tail.append(chunk)
        self._tail_bytes += len(chunk)
        while self._tail and self._tail_bytes - len(self._tail[0]) >= tail_limit:
            self._tail_bytes -= len(self._tail.popleft())

    def head_bytes(self) -> bytes:
        return bytes(self._head)

    def _tail_view(self) -> bytes:
        tail = b"".join(self._tail)
        keep = self.limit_bytes - self.limit_bytes // 2
        return tail[-keep:] if keep else b""

    def text(self) -> str:
        if not self.truncated:
            return (bytes(self._head) + b"".join(self._tail)).decode("utf-8", "replace")
        dropped = self.total_bytes - len(self._head) - len(self._tail_view())
        marker = f"\n[... {dropped} bytes of output truncated ...]\n".encode()
        return (bytes(self._head) + marker + self._tail_view()).decode("utf-8", "replace")
