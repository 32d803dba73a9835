"""A lead driving fleetd through the Python `mcp` SDK (a second, independent MCP client).

usage: lead.py URL TOKEN MODE WORKER
MODE is the SDK's lifecycle mode: "legacy" (initialize + sessions) or "auto" (2026-07-28).
Prints one JSON object with what the lead saw.
"""
import json
import sys

import anyio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def main(url: str, token: str, mode: str, worker: str) -> None:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, Client(streamable_http_client(url, http_client=http), mode=mode) as client:
        tools = sorted(t.name for t in (await client.list_tools()).tools)
        spawned = await client.call_tool("fleet_spawn", {"profile": "sim", "name": worker})
        sent = await client.call_tool(
            "fleet_send", {"to": worker, "message": f"hello from python {mode}", "wait_s": 30}
        )
        bad = await client.call_tool("fleet_send", {"to": "nobody", "message": "x"})
        progress = []

        async def on_progress(done, total, message):
            progress.append(message)

        slow = await client.call_tool(
            "fleet_send",
            {"to": worker, "message": "/slow 5500 patience", "wait_s": 20},
            progress_callback=on_progress,
        )
        print(
            json.dumps(
                {
                    "protocol": str(client.protocol_version),
                    "tools": tools,
                    "spawned": spawned.structured_content,
                    "sent": sent.structured_content,
                    "bad_is_error": bad.is_error,
                    "bad": bad.structured_content,
                    "slow": slow.structured_content,
                    "progress": progress,
                }
            )
        )


anyio.run(main, *sys.argv[1:5])
