"""A GGUF file at an http(s) URL, read as a file: the header of a 300 GB model for a few MB of it.

As the Hugging Face hub's GGUF parsers do (huggingface.js `gguf`: a first chunk, then more on
demand), the header reader's reads are served from `BLOCK`-aligned blocks fetched with HTTP
range requests and kept, so the metadata a header-only copy reads twice is fetched once.

A server that does not honor `Range` answers the first request with the whole file (200). That
answer is then read as a stream, only as far as the header goes, and closed: the bytes read are
the header's plus at most one block, as with ranges (one connection, no second request). Either
way the bytes a header may take are bounded (`MAX_FETCH`): a damaged or crafted file cannot make
the reader download a model.

Every request is bounded in time as well as in bytes: `TIMEOUT` for each read, `REQUEST_DEADLINE`
for a request and its whole answer (a server sending one byte a second never times a read out; the
deadline shuts the socket), `TOTAL_DEADLINE` for all of a file's requests together (a header of
many blocks, each just inside its own deadline), and an answer holds no more bytes than were asked for.

Errors (not found, refused, no answer, a redirect loop, a file that changes between requests) are
one `ModelFileError` line naming the URL.
"""

from __future__ import annotations

import http.client
import posixpath
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from http.client import HTTPException, HTTPResponse
from urllib.parse import urlsplit, urlunsplit

from kvphase import __version__
from kvphase.errors import ModelFileError

BLOCK = 1 << 20  # bytes a range request asks for at least (the hub's parsers ask for 2 MB first)
MAX_FETCH = 256 << 20  # bytes a header may take: a vocabulary of 10^6 tokens and 10^5 tensor records fit
TIMEOUT = 30.0  # seconds a server may keep one read of an answer waiting
REQUEST_DEADLINE = 120.0  # seconds a request and its whole answer may take (a block, or the first one with a redirect)
TOTAL_DEADLINE = 600.0  # seconds every request for one file's header may take together: a header of many blocks
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


def is_url(text: object) -> bool:
    """Whether a command-line MODEL names an http(s) URL rather than a file."""
    return str(text).lower().startswith(("http://", "https://"))


class Url(str):
    """A model's URL where the header reader's callers expect a Path: `name`, `stem` and
    `with_name` (a split model's other shards sit beside the first, at the same URL but for the name)."""

    def __new__(cls, text: str) -> Url:
        try:
            parts = urlsplit(text)
            parts.port  # noqa: B018 (a port out of range raises here)
        except ValueError as exc:
            raise ModelFileError(f"not a valid model URL: {text} ({exc})") from None
        if not parts.hostname:
            raise ModelFileError(f"not a valid model URL: {text} (no host)")
        return super().__new__(cls, text)

    @property
    def name(self) -> str:
        return posixpath.basename(urlsplit(self).path)

    @property
    def stem(self) -> str:
        return posixpath.splitext(self.name)[0]

    def with_name(self, name: str) -> Url:
        parts = urlsplit(self)
        return Url(urlunsplit(parts._replace(path=posixpath.join(posixpath.dirname(parts.path), name))))


class Deadline:
    """Shuts the sockets of one request (every hop of its redirects) once `seconds` pass: a read
    blocked on a server that trickles its answer returns at once. `passed`: it did."""

    def __init__(self, seconds: float, sockets: tuple[socket.socket, ...] = ()):
        self.seconds, self.sockets, self.passed = seconds, list(sockets), False
        self._timer = threading.Timer(seconds, self._shut)
        self._timer.daemon = True

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()

    def _shut(self) -> None:
        self.passed = True
        for sock in self.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def opener(self) -> urllib.request.OpenerDirector:
        """urllib's opener (redirects, proxies) whose connections hand their sockets to this deadline."""
        deadline = self

        class Watched(http.client.HTTPConnection):
            def connect(self) -> None:
                super().connect()
                deadline.sockets.append(self.sock)

        class WatchedTLS(http.client.HTTPSConnection):
            def connect(self) -> None:
                super().connect()
                deadline.sockets.append(self.sock)

        class Handler(urllib.request.HTTPHandler):
            def http_open(self, req):
                return self.do_open(Watched, req)

        class TLSHandler(urllib.request.HTTPSHandler):
            def https_open(self, req):
                return self.do_open(WatchedTLS, req, context=self._context)

        return urllib.request.build_opener(Handler, TLSHandler)


class RemoteFile:
    """The read-only, seekable file a URL holds, as `read_gguf_header` reads a local one."""

    def __init__(self, url: Url, timeout: float = TIMEOUT, deadline: float | None = None):
        self.name, self.timeout, self.deadline_s = url, timeout, deadline or REQUEST_DEADLINE
        self.total_s = TOTAL_DEADLINE
        self.ends = time.monotonic() + self.total_s  # every request's deadline falls before this
        self.total_bound = False  # whether the request under way ends at `ends` rather than at its own deadline
        self.deadline = Deadline(deadline)  # the request under way's
        self.pos = 0
        self.blocks: dict[int, bytes] = {}  # block index -> its bytes (BLOCK each, the last one shorter)
        self.fetched = 0  # bytes received, for the limit and for a test's count
        self.stream: HTTPResponse | None = None  # a server without ranges: the whole-file answer, read so far
        self.target = str(url)  # where the requests go: the first answer's address once redirected (the hub's CDN)
        self.size = self._open()  # bytes of the file, as the first answer states

    # -- the file interface the header reader uses
    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset + (self.size if whence == 2 else self.pos if whence == 1 else 0)
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        first, last = self.pos // BLOCK, (end - 1) // BLOCK
        self._fetch(first, last)
        data = b"".join(self.blocks[i] for i in range(first, last + 1))
        start, self.pos = self.pos, end
        return data[start - first * BLOCK:end - first * BLOCK]

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()  # a server sending the whole file stops at the closed connection
            self.stream = None

    def __enter__(self) -> RemoteFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the requests
    def _open(self) -> int:
        """The first block, and the file's size from the answer."""
        with self._new_deadline():
            response = self._request(0, BLOCK - 1)
            self.target = response.geturl() or self.target
            if response.status == 206:
                size = self._total(response, 0)
                self.blocks[0] = self._body(response, min(BLOCK, size))
                return size
        length = response.headers.get("Content-Length")
        if response.status != 200 or not (length or "").isdigit():
            response.close()
            raise ModelFileError(f"cannot read model URL {self.name}: the server answers a range request with HTTP "
                                 f"{response.status} and {'no' if not length else 'a bad'} length")
        self.stream = response  # no ranges: the whole file follows, read only as far as the header goes
        return int(length)

    def _fetch(self, first: int, last: int) -> None:
        """Blocks first..last into `blocks`: one range request for each run of missing ones (a
        server without ranges: its answer read on through the last)."""
        missing = [i for i in range(first, last + 1) if i not in self.blocks]
        if missing and self.stream is not None:
            self._read_stream_to(missing[-1])
            return
        runs: list[list[int]] = []  # [first, last] of each run of consecutive missing blocks
        for i in missing:
            if runs and runs[-1][1] == i - 1:
                runs[-1][1] = i
            else:
                runs.append([i, i])
        for start, stop in runs:
            self._fetch_run(start, stop)

    def _fetch_run(self, start: int, last: int) -> None:
        """Blocks start..last, in one range request."""
        end = min(self.size, (last + 1) * BLOCK)
        self._check_limit(end - start * BLOCK)
        with self._new_deadline():
            response = self._request(start * BLOCK, end - 1)
            if response.status != 206:
                response.close()
                raise ModelFileError(f"cannot read model URL {self.name}: the server answered a range request with "
                                     f"HTTP {response.status} after serving ranges before")
            total = self._total(response, start * BLOCK)
            if total != self.size:
                response.close()
                raise ModelFileError(f"cannot read model URL {self.name}: it changed while it was read (its size "
                                     f"was {self.size} bytes, now {total})")
            body = self._body(response, end - start * BLOCK)
        for i in range(start, last + 1):
            self.blocks[i] = body[(i - start) * BLOCK:(i - start + 1) * BLOCK]

    def _read_stream_to(self, last: int) -> None:
        """A server without ranges: the whole-file answer read on, block by block, through block `last`."""
        while max(self.blocks, default=-1) < last:
            i = max(self.blocks, default=-1) + 1
            self._check_limit(min(BLOCK, self.size - i * BLOCK))
            with self._new_deadline(self.deadline.sockets):
                self.blocks[i] = self._body(self.stream, min(BLOCK, self.size - i * BLOCK))

    def _check_limit(self, n: int) -> None:
        """Before `n` more bytes are asked for: a header past MAX_FETCH is no model's."""
        if self.fetched + n > MAX_FETCH:
            self.close()
            raise ModelFileError(f"cannot read model URL {self.name}: its header goes on past {MAX_FETCH >> 20} MiB, "
                                 "more than any model's; a damaged file, or not a model")

    def _new_deadline(self, sockets: list[socket.socket] | tuple = ()) -> Deadline:
        """The deadline of the next request (or of the next block of a whole-file answer, on its sockets):
        its own, or the end of all of the file's requests when that comes first."""
        left = self.ends - time.monotonic()
        self.total_bound = left < self.deadline_s
        if left <= 0:
            raise self._broken(TimeoutError(), total=True)
        self.deadline = Deadline(min(self.deadline_s, left), tuple(sockets))
        return self.deadline

    def _request(self, start: int, end: int) -> HTTPResponse:
        request = urllib.request.Request(self.target, headers={
            "Range": f"bytes={start}-{end}", "Accept-Encoding": "identity", "User-Agent": f"kvphase/{__version__}"})
        try:
            response = self.deadline.opener().open(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            exc.close()
            reason = (str(exc.reason).splitlines() or ["no reason"])[0]
            what = ("not found" if exc.code == 404 else "redirects in a loop or too often" if 300 <= exc.code < 400
                    else f"refused ({reason})")
            raise ModelFileError(f"model URL {what}: {self.name} (HTTP {exc.code})") from None
        except urllib.error.URLError as exc:
            if self.deadline.passed:
                raise self._broken(exc) from None
            reason = exc.reason.strerror if isinstance(exc.reason, OSError) and exc.reason.strerror else exc.reason
            raise ModelFileError(f"cannot reach model URL {self.name}: {reason}") from None
        except (OSError, HTTPException) as exc:
            raise self._broken(exc) from None
        if self.deadline.passed:  # shut mid-header, an answer can look whole: a status, no length
            response.close()
            raise self._broken(TimeoutError())
        return response

    def _body(self, response: HTTPResponse, n: int) -> bytes:
        """`n` bytes of an answer's body; fewer is a cut connection, more (a range answer going on past
        its range, stated or not) a server that does not answer what was asked."""
        try:
            data = response.read(n)
            more = len(data) == n and response is not self.stream and (response.length or len(response.read(1))) > 0
        except (OSError, HTTPException) as exc:
            raise self._broken(exc) from None
        finally:
            if response is not self.stream:
                response.close()
        if self.deadline.passed:
            raise self._broken(TimeoutError())
        if len(data) != n or more:
            raise ModelFileError(f"cannot read model URL {self.name}: the server sent {len(data)}{' and more' * more} "
                                 f"bytes where {n} were asked for")
        self.fetched += n
        return data

    def _total(self, response: HTTPResponse, start: int) -> int:
        """The file's size a partial answer states."""
        match = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
        if not match or int(match.group(1)) != start:
            response.close()
            raise ModelFileError(f"cannot read model URL {self.name}: the server's partial answer states no "
                                 f"range from byte {start} (Content-Range: {response.headers.get('Content-Range')})")
        return int(match.group(3))

    def _broken(self, exc: BaseException, total: bool = False) -> ModelFileError:
        if total or self.deadline.passed and self.total_bound:
            self.close()
            return ModelFileError(f"cannot read model URL {self.name}: no whole header within {self.total_s:g} s "
                                  "(the limit of all of a file's requests)")
        if self.deadline.passed:
            return ModelFileError(f"cannot read model URL {self.name}: no whole answer within {self.deadline_s:g} s "
                                  "(the limit of one request)")
        if isinstance(exc, (TimeoutError, socket.timeout)):
            return ModelFileError(f"cannot read model URL {self.name}: no answer within {self.timeout:g} s")
        return ModelFileError(f"cannot read model URL {self.name}: {getattr(exc, 'strerror', None) or exc}")
