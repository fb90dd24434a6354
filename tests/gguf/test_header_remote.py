"""`kvphase header` and `inspect` on a model that is not here: its URL, read by HTTP ranges
(only the header's bytes), or its head (a file cut anywhere after its tensor table).

The URLs are served on 127.0.0.1 by `FileServer`, which counts the bytes it sends; no test
leaves the machine."""

from __future__ import annotations

import re
import socket
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers.cli_checks import one_line_error
from tests.helpers.fake_servers import LocalServer, QuietHTTPServer
from tests.helpers.gguf_corpus import split_gguf
from kvphase.cli import app
from kvphase.errors import GGUFError, ModelFileError
from kvphase.gguf.header import SOURCE_SIZE, read_gguf_header
from kvphase.gguf.header_only import write_header_only
from kvphase.gguf import remote
from kvphase.gguf.remote import BLOCK, RemoteFile, Url

runner = CliRunner()
SEND_CHUNK = 1 << 16  # bytes the server writes at a time, so that it notices a client that hung up


class FileServer(LocalServer):
    """Files by name on 127.0.0.1, with byte ranges (206) or, `ranges=False`, always the whole
    file (200, as a server that ignores Range does); r/NAME redirects to NAME (as the hub's
    resolve/ addresses do to its CDN); 404 for any other name. `sent` counts the body bytes
    written, `requests` the Range headers received, `redirects` the redirects made."""

    def __init__(self, files: dict[str, Path], ranges: bool = True):
        self.files, self.ranges = files, ranges
        self.sent, self.requests, self.redirects = 0, [], 0
        self._lock = threading.Lock()
        self._listen(QuietHTTPServer(("127.0.0.1", 0), self._handler()))

    def _send(self, handler: BaseHTTPRequestHandler, path: Path, start: int, end: int) -> None:
        """Bytes [start, end) of the file, a chunk at a time, until the client hangs up."""
        with path.open("rb") as f:
            f.seek(start)
            while start < end:
                chunk = f.read(min(SEND_CHUNK, end - start))
                try:
                    handler.wfile.write(chunk)
                except ConnectionError:
                    return
                with self._lock:
                    self.sent += len(chunk)
                start += len(chunk)

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 10  # a handler never waits longer on a client

            def do_GET(self):
                name = self.path.lstrip("/")
                if name.startswith("r/") and name[2:] in server.files:
                    server.redirects += 1
                    self.send_response(302)
                    self.send_header("Location", f"/{name[2:]}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                path = server.files.get(name)
                if path is None:
                    self.send_error(404)
                    return
                size, asked = path.stat().st_size, self.headers.get("Range")
                server.requests.append(asked)
                match = re.fullmatch(r"bytes=(\d+)-(\d+)", asked or "")
                if server.ranges and match:
                    start, end = int(match.group(1)), min(size, int(match.group(2)) + 1)
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
                else:
                    start, end = 0, size
                    self.send_response(200)
                self.send_header("Content-Length", str(end - start))
                self.end_headers()
                server._send(self, path, start, end)

            def log_message(self, *args):
                pass

        return Handler


def header_end(model: Path) -> int:
    """Where the tensor data starts: the bytes a header-only copy needs are before it."""
    return min(t.data_offset for t in read_gguf_header(model).tensors)


def fetch_bound(model: Path) -> int:
    """The most a header read should fetch: the blocks up to the data, and the parser's read-ahead
    window (one block) past its last read."""
    return (header_end(model) // BLOCK + 2) * BLOCK


# --------------------------------------------------------------------------- a URL


def test_a_url_gives_the_header_only_file_the_model_gives_for_its_header_bytes(default_model, tmp_path):
    runner_out = {}
    with FileServer({"m/smollm2.gguf": default_model}) as server:
        url = f"{server.url}/m/smollm2.gguf"
        for where, source in (("url", url), ("file", str(default_model))):
            result = runner.invoke(app, ["header", source, str(tmp_path / f"{where}.gguf")])
            assert result.exit_code == 0, result.output
            runner_out[where] = result.output
    size = default_model.stat().st_size
    assert (tmp_path / "url.gguf").read_bytes() == (tmp_path / "file.gguf").read_bytes()
    assert server.sent <= fetch_bound(default_model) and server.sent < 0.1 * size, (server.sent, size)
    assert server.requests[0] == f"bytes=0-{BLOCK - 1}" and len(server.requests) <= fetch_bound(default_model) // BLOCK
    assert runner_out["url"].split(": ", 1)[1] == runner_out["file"].split(": ", 1)[1]


def test_a_redirect_is_followed_once_and_its_target_asked_for_the_rest(default_model, tmp_path):
    with FileServer({"smollm2.gguf": default_model}) as server:
        written = write_header_only(f"{server.url}/r/smollm2.gguf", tmp_path / "h.gguf")
    assert written.path.read_bytes() == write_header_only(default_model, tmp_path / "local.gguf").path.read_bytes()
    assert server.redirects == 1 and len(server.requests) >= 2, (server.redirects, server.requests)


def test_inspect_reads_a_url_as_it_reads_the_file(default_model):
    with FileServer({"smollm2.gguf": default_model}) as server:
        url = f"{server.url}/smollm2.gguf"
        remote, local = read_gguf_header(url), read_gguf_header(default_model)
        shown = runner.invoke(app, ["inspect", url], env={"COLUMNS": "200"})
    assert (remote.file_size, remote.fields, remote.tensors) == (local.file_size, local.fields, local.tensors)
    assert remote.path == url and remote.path.name == "smollm2.gguf"
    expected = runner.invoke(app, ["inspect", str(default_model)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and expected.exit_code == 0, shown.output
    rows = [[line.rstrip() for line in result.output.splitlines()] for result in (shown, expected)]
    assert rows[0][1:] == rows[1][1:]  # all but the file row
    assert url in shown.output.splitlines()[0]


def test_a_split_model_at_a_url_is_read_from_its_first_shard_with_every_shards_tensors(tiny_deepseek4, tmp_path):

    shards = split_gguf(tiny_deepseek4, tmp_path, tensors_per_shard=20)
    local = write_header_only(shards[0], tmp_path / "local.gguf")
    with FileServer({f"x/{path.name}": path for path in shards}) as server:
        remote = write_header_only(f"{server.url}/x/{shards[0].name}", tmp_path / "remote.gguf")
    assert (remote.n_shards, remote.n_tensors, remote.source_size) == (local.n_shards, local.n_tensors,
                                                                       sum(p.stat().st_size for p in shards))
    assert remote.path.read_bytes() == local.path.read_bytes()


def test_a_server_that_ignores_ranges_is_read_only_as_far_as_the_header(default_model, tmp_path):
    """The whole-file answer is read as a stream and closed after the header: the server stops
    sending at the closed connection, long before the end of the file."""
    with FileServer({"smollm2.gguf": default_model}, ranges=False) as server:
        written = write_header_only(f"{server.url}/smollm2.gguf", tmp_path / "h.gguf")
    assert written.path.read_bytes() == write_header_only(default_model, tmp_path / "local.gguf").path.read_bytes()
    assert len(server.requests) == 1, server.requests
    # what the server wrote: the header's blocks, plus what the sockets' buffers took before it saw the close
    assert server.sent < 0.5 * default_model.stat().st_size, (server.sent, default_model.stat().st_size)


@pytest.mark.parametrize("command", ["inspect", "header"])
def test_a_url_that_is_not_there_is_one_line(command, default_model, tmp_path):
    out = [str(tmp_path / "h.gguf")] if command == "header" else []
    with FileServer({"smollm2.gguf": default_model}) as server:
        missing = f"{server.url}/nope.gguf"
        one_line_error(runner.invoke(app, [command, missing, *out]), f"model URL not found: {missing} (HTTP 404)")
    with socket.socket() as free:  # a port nothing listens on: bound, then released
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    refused = f"http://127.0.0.1:{port}/m.gguf"
    one_line_error(runner.invoke(app, [command, refused, *out]), f"cannot reach model URL {refused}: ",
                   "refused")
    for bad, why in (("http://[::1/m.gguf", "not a valid model URL"), ("https://", "not a valid model URL"),
                     ("ftp://127.0.0.1/m.gguf", "not a model file or an http(s) URL")):
        one_line_error(runner.invoke(app, [command, bad, *out]), f"{why}: {bad}")
    assert not (tmp_path / "h.gguf").exists()


@pytest.mark.parametrize("ranges", [True, False], ids=["ranges", "no ranges"])
def test_the_remote_file_reads_what_the_file_holds_wherever_it_is_read(ranges, tmp_path):
    import random

    data = random.Random(0).randbytes(3 * BLOCK + 123)  # blocks 0-2 whole, the last 123 bytes
    (tmp_path / "f.bin").write_bytes(data)
    rng = random.Random(1)
    with FileServer({"f.bin": tmp_path / "f.bin"}, ranges=ranges) as server, RemoteFile(Url(f"{server.url}/f.bin")) as f:
        assert f.seek(0, 2) == len(data) and f.seek(0) == 0
        # block 0 is read on opening; then block 2 alone, then blocks 1 and 3 around it (two runs)
        reads = [(2 * BLOCK + 5, 9), (BLOCK - 1, 2 * BLOCK + 200), (0, 1), (len(data), 5), (3 * BLOCK, 10**9)]
        reads += [(rng.randrange(len(data)), rng.randrange(2 * BLOCK)) for _ in range(50)]
        for at, n in reads:
            f.seek(at)
            assert f.read(n) == data[at:at + n] and f.pos == min(at + n, len(data)), (at, n)
    assert f.fetched == server.sent == len(data), (f.fetched, server.sent)  # each byte once


def test_a_file_that_changes_or_a_server_that_stops_serving_ranges_is_one_error(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(3 * BLOCK))
    with FileServer({"f.bin": path}) as server, RemoteFile(Url(f"{server.url}/f.bin")) as f:
        path.write_bytes(bytes(4 * BLOCK))  # replaced by a longer file after the first block
        f.seek(2 * BLOCK)
        with pytest.raises(ModelFileError, match=r"it changed while it was read \(its size was 3145728 bytes, now 4194304\)"):
            f.read(10)
        server.ranges = False
        with pytest.raises(ModelFileError, match="answered a range request with HTTP 200 after serving ranges before"):
            f.read(10)


def test_a_header_that_goes_on_past_the_limit_stops_the_download(default_model, monkeypatch):
    monkeypatch.setattr(remote, "MAX_FETCH", BLOCK)  # the default model's header takes 1.7 MiB
    with FileServer({"m.gguf": default_model}) as server:
        url = f"{server.url}/m.gguf"
        one_line_error(runner.invoke(app, ["inspect", url]), f"cannot read model URL {url}: its header goes on past 1 MiB")
    assert server.sent == BLOCK, server.sent


def test_a_server_that_never_answers_is_one_error_after_the_timeout():
    with socket.socket() as silent:  # listens, and never accepts: the request waits in the backlog
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/m.gguf"
        with pytest.raises(ModelFileError, match=re.escape(f"cannot read model URL {url}: no answer within 0.3 s")):
            RemoteFile(Url(url), timeout=0.3)


# --------------------------------------------------------------------------- the head of a file


def cut(model: Path, at: int, out: Path) -> Path:
    with model.open("rb") as src:
        out.write_bytes(src.read(at))
    return out


def test_a_file_cut_inside_its_tensor_data_serves_inspect_and_header(default_model, tmp_path):
    size = default_model.stat().st_size
    head = cut(default_model, header_end(default_model) + (size - header_end(default_model)) // 2, tmp_path / "head.gguf")
    shown = runner.invoke(app, ["inspect", str(head)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    needed = re.search(r"cut short: the file ends inside its tensor data, which runs to ([\d,.]+) MiB", shown.output)
    assert needed and needed.group(1) == f"{size / 2**20:,.1f}", shown.output
    assert read_gguf_header(head, partial=True).needed_size == size
    from_head = write_header_only(head, tmp_path / "from-head.gguf")
    from_model = write_header_only(default_model, tmp_path / "from-model.gguf")
    assert from_head.source_size == from_model.source_size == size
    a, b = read_gguf_header(from_head.path), read_gguf_header(from_model.path)
    assert {k: v for k, v in a.fields.items() if k != SOURCE_SIZE} == {k: v for k, v in b.fields.items() if k != SOURCE_SIZE}
    assert a.tensors == b.tensors
    with pytest.raises(GGUFError, match="truncated GGUF file: .* ends inside its tensor data"):
        read_gguf_header(head)  # what reads weights still refuses it


@pytest.mark.parametrize("part", ["metadata", "tensor table"])
@pytest.mark.parametrize("command", ["inspect", "header"])
def test_a_file_cut_before_its_tensor_data_is_one_line_naming_the_part(part, command, default_model, tmp_path):
    header = read_gguf_header(default_model)
    metadata_end = max(end for _, end in header.spans.values())
    at = metadata_end // 2 if part == "metadata" else (metadata_end + header_end(default_model)) // 2
    head = cut(default_model, at, tmp_path / "head.gguf")
    out = [str(tmp_path / "h.gguf")] if command == "header" else []
    one_line_error(runner.invoke(app, [command, str(head), *out], env={"COLUMNS": "300"}),
                   f"truncated GGUF file: {head} ends inside its {part} (offset ")


def test_every_cut_of_a_small_file_names_the_part_it_ends_in_or_gives_the_header(tmp_path):
    """Each cut of the fuzz corpus' valid file, the parts located by the corpus' own walk: before
    the tensor data, one GGUFError whose named part is the one cut; from there on, the header."""
    from tests.helpers.gguf_corpus import layout, valid_file

    data, path = valid_file(), tmp_path / "f.gguf"
    path.write_bytes(data)
    _, table_end = layout(path)
    metadata_end = table_end - (8 + 1 + 4 + 8 + 4 + 8)  # the one tensor record: name "t", one dimension
    data_start = len(data) - 4 * 4  # the one tensor's 4 float32 values end the file, unpadded
    named = set()
    for at in range(len(data) + 1):
        path.write_bytes(data[:at])
        if at < table_end:
            with pytest.raises(GGUFError, match=r"^(truncated GGUF file|not a GGUF file)") as error:
                read_gguf_header(path, partial=True)
            part = re.search(r"ends inside its (.*?) \(", str(error.value))
            if part:
                expected = "version and counts" if at < 24 else "metadata" if at < metadata_end else "tensor table"
                assert part.group(1) == expected, (at, str(error.value))
                named.add(part.group(1))
        else:
            header = read_gguf_header(path, partial=True)
            assert header.fields["x.words"] == ["a", "bc"] and header.tensors[0].data_offset == data_start
            assert header.needed_size == (data_start + 32 if at < len(data) else None), at  # padded to 32 bytes
    assert named == {"version and counts", "metadata", "tensor table"}
