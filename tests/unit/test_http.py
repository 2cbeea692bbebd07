"""monitor/http.py over in-memory streams: what one connection gets for what it sends.

The byte-level behaviour (pipelining, limits, timeouts, garbage) without sockets; the same
server over real sockets, resets and floods is in tests/kernel/test_http_endpoint.py.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import ipaddress
import ssl
from pathlib import Path

import h11
import pytest
import trio
import trio.testing
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from monitor import http
from monitor.http import Limits, Request, Response

LIMITS = Limits(request_timeout=1.0, idle_timeout=0.5, max_body_bytes=64,
                max_requests_per_connection=3)


async def echo(request: Request) -> Response:
    return Response(200, f"{request.method} {request.target} {len(request.body)}".encode())


async def broken(request: Request) -> Response:
    raise RuntimeError("a bug in a handler")


HANDLER = http.route({"/echo": {"GET": echo, "POST": echo}, "/broken": {"GET": broken}})


async def exchange(data: bytes, limits: Limits = LIMITS, half_close: bool = True,
                   handler: http.Handler = HANDLER,
                   methods: tuple[str, ...] = ()) -> list[h11.Response | bytes]:
    """Send `data` on a fresh connection; the responses (with their bodies) until the server
    closes."""
    client, server = trio.testing.memory_stream_pair()
    received = bytearray()
    async with trio.open_nursery() as nursery:
        async def run_server() -> None:
            try:
                await http._Connection(server, handler, limits).run()
            finally:
                await server.aclose()
        nursery.start_soon(run_server)
        await client.send_all(data)
        if half_close:
            await client.send_eof()
        with trio.fail_after(10):
            while chunk := await client.receive_some():
                received += chunk
    return parse_responses(bytes(received), methods)


def parse_responses(data: bytes, methods: tuple[str, ...] = ()) -> list[h11.Response | bytes]:
    """The responses in `data`, read as answers to `methods` (then GETs)."""
    conn = h11.Connection(h11.CLIENT)
    out: list[h11.Response | bytes] = []
    conn.receive_data(data)
    conn.receive_data(b"")
    for n in range(1000):
        method = methods[n] if n < len(methods) else "GET"
        conn.send(h11.Request(method=method, target="/", headers=[("Host", "x")]))
        conn.send(h11.EndOfMessage())
        body = b""
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:  # closed where a response would be
                return out
            if isinstance(event, h11.Response):
                out.append(event)
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                out.append(body)
                break
            else:  # ConnectionClosed / NEED_DATA: no more responses
                return out
        if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            return out
        conn.start_next_cycle()
    return out


def statuses(responses: list[h11.Response | bytes]) -> list[int]:
    return [r.status_code for r in responses if isinstance(r, h11.Response)]


def bodies(responses: list[h11.Response | bytes]) -> list[bytes]:
    return [r for r in responses if isinstance(r, bytes)]


GET = b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"


async def test_pipelined_requests_are_answered_in_order() -> None:
    pipelined = (b"GET /echo?1 HTTP/1.1\r\nHost: x\r\n\r\n"
                 b"POST /echo?2 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
                 b"GET /echo?3 HTTP/1.1\r\nHost: x\r\n\r\n")
    got = await exchange(pipelined)
    assert statuses(got) == [200, 200, 200]
    assert bodies(got) == [b"GET /echo?1 0", b"POST /echo?2 5", b"GET /echo?3 0"]


async def test_requests_per_connection_are_capped() -> None:
    got = await exchange(GET * 5)
    assert statuses(got) == [200, 200, 200]  # max_requests_per_connection, then close
    last = got[-2]
    assert isinstance(last, h11.Response) and (b"connection", b"close") in last.headers


async def test_routing_404_405_and_head() -> None:
    assert statuses(await exchange(b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")) == [404]
    got = await exchange(b"DELETE /echo HTTP/1.1\r\nHost: x\r\n\r\n")
    assert statuses(got) == [405]
    first = got[0]
    assert isinstance(first, h11.Response)
    assert dict(first.headers)[b"allow"] == b"GET, HEAD, POST"
    head = await exchange(b"HEAD /echo HTTP/1.1\r\nHost: x\r\n\r\n" + GET,
                          methods=("HEAD", "GET"))
    assert statuses(head) == [200, 200] and bodies(head) == [b"", b"GET /echo 0"]


@pytest.mark.parametrize("garbage", [
    bytes(range(256)) * 4 + b"\r\n\r\n",
    b"GET / FTP/1.0\r\n\r\n",
    b"GET /echo HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n",
    b"GET /echo HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
    b"GET /echo HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
    b"GET /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
    b"\r\n\r\n\r\n",
    b"GET /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nab",  # EOF mid-body
    b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",  # smuggling
])
async def test_garbage_gets_400_and_close(garbage: bytes) -> None:
    assert statuses(await exchange(garbage)) == [400]


async def test_head_and_body_limits() -> None:
    huge_head = b"GET /echo HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 9000 + b"\r\n\r\n"
    assert statuses(await exchange(huge_head)) == [431]
    declared = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 65\r\n\r\n" + b"a" * 65
    assert statuses(await exchange(declared)) == [413]
    chunked = (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               + (b"20\r\n" + b"a" * 32 + b"\r\n") * 3 + b"0\r\n\r\n")
    assert statuses(await exchange(chunked)) == [413]
    fits = chunked.replace(b"20\r\n" + b"a" * 32 + b"\r\n", b"", 1)
    assert bodies(await exchange(fits)) == [b"POST /echo 64"]
    no_body = Limits(max_body_bytes=0)
    one_byte = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na"
    assert statuses(await exchange(one_byte, limits=no_body)) == [413]


async def test_slow_request_gets_408_and_idle_connection_closes_silently() -> None:
    client, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(http._Connection(server, HANDLER, LIMITS).run)
        start = trio.current_time()
        await client.send_all(b"GET /echo HTTP/1.1\r\n")  # ... and never the rest
        received = b""
        with trio.fail_after(5):
            while b"\r\n\r\n" not in received:
                received += await client.receive_some()
        assert received.startswith(b"HTTP/1.1 408 ")
        assert trio.current_time() - start >= LIMITS.request_timeout
    # a fresh connection that sends nothing is closed without an answer
    assert await exchange(b"", half_close=False) == []
    # a kept-alive connection that goes quiet after one answer is closed without another
    assert statuses(await exchange(GET, half_close=False)) == [200]


async def test_expect_100_continue_is_answered_before_the_body() -> None:
    client, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(http._Connection(server, HANDLER, LIMITS).run)
        await client.send_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
                              b"Expect: 100-continue\r\n\r\n")
        with trio.fail_after(5):
            assert (await client.receive_some()).startswith(b"HTTP/1.1 100 ")
            await client.send_all(b"body")
            received = b""
            while not received.endswith(b"POST /echo 4"):
                received += await client.receive_some()
        assert received.startswith(b"HTTP/1.1 200 ")
        await client.aclose()


async def test_a_trickled_request_is_read_at_most_every_pace_seconds() -> None:
    """Slowloris bytes must not wake the loop once per byte: after two small reads in a
    row the server waits PACE before reading again (the request is still answered)."""
    client, server = trio.testing.memory_stream_pair()
    reads = 0
    real_receive = server.receive_some

    async def counted(max_bytes: int | None = None) -> bytes | bytearray:
        nonlocal reads
        reads += 1
        return await real_receive(max_bytes)

    server.receive_some = counted  # type: ignore[method-assign]
    request = b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 60 + b"\r\n\r\n"
    received = b""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(http._Connection(server, HANDLER, Limits(request_timeout=5)).run)
        start = trio.current_time()
        for byte in request:
            await client.send_all(bytes([byte]))
            await trio.sleep(0.01)
        with trio.fail_after(5):
            while b"GET /echo 0" not in received:
                received += await client.receive_some()
        elapsed = trio.current_time() - start
        await client.aclose()
    assert received.startswith(b"HTTP/1.1 200 ")
    assert reads <= elapsed / http.PACE + 4, (reads, len(request), elapsed)


async def test_a_failing_handler_gets_500_and_the_connection_goes_on() -> None:
    got = await exchange(b"GET /broken HTTP/1.1\r\nHost: x\r\n\r\n" + GET)
    assert statuses(got) == [500, 200]


async def test_a_client_that_does_not_read_loses_its_connection() -> None:
    async def big(request: Request) -> Response:
        return Response(200, b"x" * 1_000_000)

    # a lockstep stream sends nothing the other side does not receive (a full socket buffer)
    client, server = trio.testing.lockstep_stream_pair()
    failed: list[BaseException] = []

    async def run_server() -> None:
        try:
            await http._Connection(server, big, LIMITS).run()
        except trio.BrokenResourceError as e:
            failed.append(e)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_server)
            await client.send_all(GET)
            assert (await client.receive_some(10)).startswith(b"HTTP/1.1 ")  # then no more
    assert failed


def test_addresses_and_connection_cap() -> None:
    assert http.parse_address("127.0.0.1:9100") == ("127.0.0.1", 9100)
    assert http.parse_address("[::1]:80") == ("::1", 80)
    assert http.parse_address(":9100") == (None, 9100)
    for bad in ("9100", "host:", "host:99999", "host:x"):
        with pytest.raises(ValueError):
            http.parse_address(bad)
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, hard))
        assert http.connection_cap(Limits(max_connections=64)) == 25
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        assert http.connection_cap(Limits(max_connections=64)) == min(64, hard // 4)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"),
                 x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def test_tls_per_connection_context_and_plain_clients_on_a_tls_port(
        tmp_path: Path) -> None:
    """serve() over real loopback sockets with TLS: the context factory runs once per
    connection (rotation), and a plain-text or broken client does not stop the server."""
    cert, key = self_signed(tmp_path)
    made = []

    def context() -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        made.append(ctx)
        return ctx

    client_ctx = ssl.create_default_context(cafile=str(cert))
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(functools.partial(
            http.serve, HANDLER, "127.0.0.1:0", name="test", limits=LIMITS,
            ssl_context=context))
        port = bound[0][1]
        plain = await trio.open_tcp_stream("127.0.0.1", port)
        await plain.send_all(GET)  # not TLS: the handshake fails, this connection ends
        with trio.fail_after(5):
            while await plain.receive_some():
                pass
        for _ in range(2):
            stream = await trio.open_ssl_over_tcp_stream("127.0.0.1", port,
                                                         ssl_context=client_ctx)
            await stream.send_all(b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            received = b""
            with trio.fail_after(5):
                with contextlib.suppress(trio.BrokenResourceError):
                    while chunk := await stream.receive_some():
                        received += chunk
            assert received.startswith(b"HTTP/1.1 200 OK\r\n")
            assert received.endswith(b"GET /echo 0")
            await stream.aclose()
        assert len(made) == 3
        nursery.cancel_scope.cancel()


# --- per-address caps, handshake and body deadlines ---------------------------------------


def test_sources_and_their_cap() -> None:
    assert http.source_of(("127.0.0.2", 5000)) == "127.0.0.2"
    assert http.source_of(("::ffff:10.1.2.3", 5000, 0, 0)) == "10.1.2.3"
    assert http.source_of(("2001:db8:1:2:aaaa::1", 5000, 0, 0)) == "2001:db8:1:2::/64"
    assert http.source_of(("2001:db8:1:2:bbbb::7", 1, 0, 0)) == "2001:db8:1:2::/64"
    assert http.per_source_cap(Limits(), 64) == 16
    assert http.per_source_cap(Limits(max_per_source=100), 64) == 64
    assert http.per_source_cap(Limits(max_per_source=0), 64) == 1


async def connect_from(source: str, port: int) -> trio.SocketStream:
    sock = trio.socket.socket()
    await sock.bind((source, 0))
    await sock.connect(("127.0.0.1", port))
    return trio.SocketStream(sock)


async def closed_without_answer(stream: trio.abc.Stream, within: float) -> bool:
    with trio.move_on_after(within):
        with contextlib.suppress(trio.BrokenResourceError):
            return await stream.receive_some() == b""
        return True
    return False


async def get_answer(stream: trio.abc.Stream, data: bytes) -> bytes:
    await stream.send_all(data)
    received = b""
    with trio.fail_after(10), contextlib.suppress(trio.BrokenResourceError):
        while chunk := await stream.receive_some():
            received += chunk
    return received


CLOSE_GET = b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


async def test_a_new_connection_takes_the_place_of_its_addresss_oldest_waiting_one() -> None:
    """Issue 37.1 / 36.5: a peer that shares the kubelet's or the API server's address and
    holds its share of slow connections once made theirs closed at once, unanswered. Now
    the newcomer stays and the address's connection that has waited longest goes."""
    limits = Limits(max_connections=8, max_per_source=2, request_timeout=5.0)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(functools.partial(
            http.serve, HANDLER, "127.0.0.1:0", name="test", limits=limits))
        port = bound[0][1]
        held = [await connect_from("127.0.0.2", port) for _ in range(2)]
        await trio.sleep(0.2)  # both admitted, in this order
        await held[1].send_all(b"GET /echo HTTP/1.1\r\n")  # half a head: still waiting
        newcomer = await connect_from("127.0.0.2", port)
        # The oldest of the address's waiting connections is closed at once ...
        assert await closed_without_answer(held[0], within=2.0)
        # ... the newcomer is answered, the other held one still is, and so is another
        # address.
        assert (await get_answer(newcomer, CLOSE_GET)).startswith(b"HTTP/1.1 200")
        assert (await get_answer(held[1], b"Host: x\r\nConnection: close\r\n\r\n")
                ).startswith(b"HTTP/1.1 200")
        other = await connect_from("127.0.0.3", port)
        assert (await get_answer(other, CLOSE_GET)).startswith(b"HTTP/1.1 200")
        for stream in (*held, newcomer, other):
            await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_connections_being_answered_never_give_way() -> None:
    """At its address's cap with every connection's request being answered, a newcomer is
    the one closed; at the server's cap, it waits in the backlog for a slot."""
    release = trio.Event()

    async def slow(request: Request) -> Response:
        await release.wait()
        return Response(200, b"slow")

    handler = http.route({"/slow": {"GET": slow}, "/echo": {"GET": echo}})
    limits = Limits(max_connections=3, max_per_source=2, request_timeout=10.0)
    get_slow = b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(functools.partial(
            http.serve, handler, "127.0.0.1:0", name="test", limits=limits))
        port = bound[0][1]
        busy = [await connect_from("127.0.0.2", port) for _ in range(2)]
        for stream in busy:
            await stream.send_all(get_slow)
        await trio.sleep(0.3)  # both being answered
        refused = await connect_from("127.0.0.2", port)
        assert await closed_without_answer(refused, within=2.0)
        third = await connect_from("127.0.0.3", port)  # the server's last slot
        await third.send_all(get_slow)
        await trio.sleep(0.3)
        queued = await connect_from("127.0.0.4", port)  # every slot busy: the backlog
        await queued.send_all(CLOSE_GET)
        assert not await closed_without_answer(queued, within=0.5)
        release.set()
        for stream in (*busy, third):
            assert (await get_answer(stream, b"")).endswith(b"slow")
        assert (await get_answer(queued, b"")).startswith(b"HTTP/1.1 200")
        for stream in (*busy, refused, third, queued):
            await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_clients_that_do_not_read_their_answers_give_way() -> None:
    """An answer being sent waits for its client: an address whose connections all hold
    an unread answer (larger than the socket buffers) still gets its newcomer served."""
    async def huge(request: Request) -> Response:
        return Response(200, b"x" * (16 * 2**20))

    handler = http.route({"/huge": {"GET": huge}, "/echo": {"GET": echo}})
    limits = Limits(max_connections=8, max_per_source=2, request_timeout=10.0)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(functools.partial(
            http.serve, handler, "127.0.0.1:0", name="test", limits=limits))
        port = bound[0][1]
        readers = [await connect_from("127.0.0.2", port) for _ in range(2)]
        for stream in readers:
            await stream.send_all(b"GET /huge HTTP/1.1\r\nHost: x\r\n\r\n")
        await trio.sleep(0.5)  # both answers stuck in full socket buffers
        newcomer = await connect_from("127.0.0.2", port)
        assert (await get_answer(newcomer, CLOSE_GET)).startswith(b"HTTP/1.1 200")
        for stream in (*readers, newcomer):
            await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_at_the_servers_cap_the_oldest_waiting_connection_gives_way() -> None:
    """Many peers, one silent connection each, fill the server: the next peer is served,
    and it is the connection that waited longest that goes (a pooled connection's wait
    begins again with each answer)."""
    limits = Limits(max_connections=4, max_per_source=4, request_timeout=10.0,
                    idle_timeout=10.0)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(functools.partial(
            http.serve, HANDLER, "127.0.0.1:0", name="test", limits=limits))
        port = bound[0][1]
        pooled = await connect_from("127.0.0.2", port)  # the oldest, answered later
        silent = [await connect_from("127.0.0.3", port)]
        await trio.sleep(0.1)
        await pooled.send_all(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        with trio.fail_after(5):
            while not first.endswith(b"GET /echo 0"):
                first += await pooled.receive_some()
        assert first.startswith(b"HTTP/1.1 200")
        for i in range(2):
            silent.append(await connect_from(f"127.0.0.{4 + i}", port))
            await trio.sleep(0.1)
        newcomer = await connect_from("127.0.0.9", port)
        assert (await get_answer(newcomer, CLOSE_GET)).startswith(b"HTTP/1.1 200")
        assert await closed_without_answer(silent[0], within=2.0)
        for stream in silent[1:]:
            assert not await closed_without_answer(stream, within=0.1)
        # The pooled connection, accepted first but answered since, outlived it.
        assert (await get_answer(pooled, CLOSE_GET)).startswith(b"HTTP/1.1 200")
        for stream in (pooled, *silent, newcomer):
            await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_a_silent_tls_client_is_closed_after_the_handshake_timeout(
        tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    limits = Limits(request_timeout=30.0, handshake_timeout=0.5)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(functools.partial(
            http.serve, HANDLER, "127.0.0.1:0", name="test", limits=limits,
            ssl_context=lambda: context))
        silent = await connect_from("127.0.0.2", bound[0][1])
        started = trio.current_time()
        assert await closed_without_answer(silent, within=10.0)
        assert trio.current_time() - started < limits.request_timeout / 2
        await silent.aclose()
        nursery.cancel_scope.cancel()


def client_hello() -> bytes:
    """A real ClientHello record, as a client's first flight."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = ssl.create_default_context().wrap_bio(incoming, outgoing,
                                                   server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


async def test_tls_state_only_for_a_whole_client_hello_and_the_oldest_gives_way(
        tmp_path: Path) -> None:
    """max_sessions=1: silent clients, and one stalled mid-ClientHello, make no TLS state
    (they do not take the session); one stalled after its ClientHello holds it only until
    another client speaks."""
    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    limits = Limits(request_timeout=30.0, handshake_timeout=20.0, max_sessions=1)
    hello = client_hello()
    assert hello[0] == 0x16 and len(hello) == 5 + int.from_bytes(hello[3:5], "big")
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(functools.partial(
            http.serve, HANDLER, "127.0.0.1:0", name="test", limits=limits,
            ssl_context=lambda: context))
        port = bound[0][1]
        silent = [await connect_from("127.0.0.2", port) for _ in range(3)]
        partial = await connect_from("127.0.0.3", port)
        await partial.send_all(hello[:-10])  # all but the end of the record
        stalled = await connect_from("127.0.0.4", port)
        await stalled.send_all(hello)  # the session is its, then it says no more
        await trio.sleep(0.3)
        for _ in range(2):
            stream = await trio.open_ssl_over_tcp_stream("127.0.0.1", port,
                                                         ssl_context=client_ctx)
            assert (await get_answer(stream, CLOSE_GET)).startswith(b"HTTP/1.1 200")
            await stream.aclose()
        with trio.fail_after(2), contextlib.suppress(trio.BrokenResourceError):
            while await stalled.receive_some():  # its ServerHello, then the close
                pass
        for stream in (*silent, partial):
            assert not await closed_without_answer(stream, within=0.1)
        for stream in (*silent, partial, stalled):
            await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_body_slots_bound_the_bodies_in_memory_and_their_time() -> None:
    """max_bodies=2, one per address: a body that trickles holds its slot for body_timeout
    at most (then 408); a request without a body never waits for one."""
    body_timeout = 3.0
    limits = Limits(max_body_bytes=1024, request_timeout=30.0, max_bodies=2,
                    body_timeout=body_timeout)
    post = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nConnection: close\r\n\r\n"
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(functools.partial(
            http.serve, HANDLER, "127.0.0.1:0", name="test", limits=limits))
        port = bound[0][1]
        slow = await connect_from("127.0.0.2", port)
        await slow.send_all(post + b"{")  # holds 127.0.0.2's body slot
        second = await connect_from("127.0.0.2", port)
        await second.send_all(post + b"0123456789")  # waits for 127.0.0.2's share
        started = trio.current_time()
        other = await connect_from("127.0.0.3", port)  # the other slot: answered now
        assert (await get_answer(other, post + b"0123456789")).endswith(b"POST /echo 10")
        probe = await connect_from("127.0.0.3", port)
        assert (await get_answer(probe, CLOSE_GET)).startswith(b"HTTP/1.1 200")
        assert trio.current_time() - started < body_timeout  # not behind the slow body
        assert (await get_answer(slow, b"")).startswith(b"HTTP/1.1 408")
        assert trio.current_time() - started < limits.request_timeout / 2
        assert (await get_answer(second, b"")).endswith(b"POST /echo 10")
        for stream in (slow, second, other, probe):
            await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_small_bodies_do_not_wait_behind_large_ones() -> None:
    limits = Limits(max_body_bytes=1024, request_timeout=30.0, max_bodies=1, body_timeout=20.0,
                    small_body_bytes=16)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(functools.partial(
            http.serve, HANDLER, "127.0.0.1:0", name="test", limits=limits))
        port = bound[0][1]
        large = await connect_from("127.0.0.2", port)
        await large.send_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{")
        small = await connect_from("127.0.0.2", port)
        reply = await get_answer(small, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10"
                                        b"\r\nConnection: close\r\n\r\n0123456789")
        assert reply.endswith(b"POST /echo 10")  # while the large body holds the only slot
        await large.aclose()
        await small.aclose()
        nursery.cancel_scope.cancel()


async def test_a_large_answer_takes_a_free_body_slot_or_is_a_503() -> None:
    """Without this, 128 connections of small reviews whose patches are large would hold
    128 large answers in memory (a client that does not read keeps its answer queued)."""
    async def large(request: Request) -> Response:
        return Response(200, b"x" * 100)

    handler = http.route({"/echo": {"POST": echo}, "/large": {"GET": large}})
    limits = Limits(max_body_bytes=1024, request_timeout=30.0, max_bodies=1, body_timeout=20.0,
                    small_body_bytes=16)
    get_large = b"GET /large HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(functools.partial(
            http.serve, handler, "127.0.0.1:0", name="test", limits=limits))
        port = bound[0][1]
        assert (await get_answer(await connect_from("127.0.0.2", port), get_large)
                ).startswith(b"HTTP/1.1 200")
        holder = await connect_from("127.0.0.3", port)
        await holder.send_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{")
        await trio.sleep(0.5)  # its head is read: it holds the only slot
        refused = await get_answer(await connect_from("127.0.0.2", port), get_large)
        assert refused.startswith(b"HTTP/1.1 503"), refused[:40]
        await holder.aclose()
        await trio.sleep(0.5)
        assert (await get_answer(await connect_from("127.0.0.2", port), get_large)
                ).startswith(b"HTTP/1.1 200")
        nursery.cancel_scope.cancel()
