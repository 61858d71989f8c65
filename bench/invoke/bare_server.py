"""The peer of skiff's warm path: the same handler behind a minimal asyncio HTTP/1.1
server (keep-alive, no platform, no isolation): what a python function costs with
nothing around it. Usage: bare_server.py PORT"""
import asyncio
import sys


def handle(event, context):
    return "ok"


async def serve(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = await reader.readexactly(length) if length else b""
            out = handle(body or None, None).encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n%s" % (len(out), out))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main(port):
    server = await asyncio.start_server(serve, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


asyncio.run(main(int(sys.argv[1])))
