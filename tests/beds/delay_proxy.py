#!/usr/bin/env python3
"""A TCP proxy that adds a fixed one-way delay in each direction: network latency for the SSH
test bed, where the kernel's netem qdisc may be missing. Listens on loopback only.

    python tests/beds/delay_proxy.py DELAY_MS LISTEN_PORT:TARGET_HOST:TARGET_PORT [...]

Prints "ready" once every port listens; runs until killed.
"""

from __future__ import annotations

import asyncio
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Forward each chunk `delay` seconds after it arrived, in order (latency, not throughput)."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
    loop = asyncio.get_running_loop()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            await asyncio.sleep(max(0.0, due - loop.time()))
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(send())
    try:
        while data := await reader.read(65536):
            queue.put_nowait((loop.time() + delay, data))
    except ConnectionError:
        pass
    queue.put_nowait((loop.time() + delay, b""))
    await sender


async def serve(listen: int, host: str, port: int, delay: float) -> asyncio.Server:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(host, port)
        await asyncio.gather(
            pipe(client_r, server_w, delay),
            pipe(server_r, client_w, delay),
            return_exceptions=True,
        )

    return await asyncio.start_server(handle, "127.0.0.1", listen)


async def main(delay_ms: float, routes: list[str]) -> None:
    servers = []
    for route in routes:
        listen, host, port = route.split(":")
        servers.append(await serve(int(listen), host, int(port), delay_ms / 1000))
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1]), sys.argv[2:]))
