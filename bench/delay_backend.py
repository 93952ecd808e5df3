#!/usr/bin/python3
"""A keep-alive HTTP/1.1 backend for bench/slow_backend.sh: answers every request `200 ok`
after DELAY_MS milliseconds (0: at once), with `X-Backend: NAME`; `GET /count` answers the
number of other requests served so far (for the script's shares). Standard library only
(Debian's /usr/bin/python3). Binds 127.0.0.1 only.

Usage: delay_backend.py PORT NAME DELAY_MS
"""
import asyncio
import sys

PORT, NAME, DELAY = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]) / 1000.0
served = 0


def answer(body: bytes) -> bytes:
    head = "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nX-Backend: {}\r\n\r\n".format(len(body), NAME)
    return head.encode() + body


async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    global served
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip() or 0)
            if length:
                await reader.readexactly(length)
            if head.startswith(b"GET /count "):
                writer.write(answer(str(served).encode()))
            else:
                if DELAY > 0:
                    await asyncio.sleep(DELAY)
                served += 1
                writer.write(answer(b"ok"))
            await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def main() -> None:
    server = await asyncio.start_server(client, "127.0.0.1", PORT, backlog=1024)
    async with server:
        await server.serve_forever()


asyncio.run(main())
