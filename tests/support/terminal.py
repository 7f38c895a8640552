"""`chatpipe chat` driven through a pseudo-terminal (pexpect). pexpect blocks, and the
pipeline may run on the test's event loop: every wait on the terminal runs in a thread."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pexpect

from chatpipe.dev_stack import API_KEY

CHATPIPE = shutil.which("chatpipe", path=str(Path(sys.executable).parent)) or "chatpipe"


class Terminal:
    def __init__(self, url: str, *options: str, api_key: str = API_KEY) -> None:
        self.child = pexpect.spawn(
            CHATPIPE,
            ["chat", "--url", url, "--api-key", api_key, *options],
            encoding="utf-8",
            timeout=30,
            dimensions=(40, 200),
        )

    async def expect(self, pattern: str) -> str:
        await asyncio.to_thread(self.child.expect, pattern)
        return self.child.after

    async def send(self, line: str) -> None:
        """Type `line` and Enter, and read past its echo."""
        self.child.sendline(line)
        await asyncio.to_thread(self.child.expect_exact, line + "\r\n")

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.child.close(force=True)

    @property
    def unread(self) -> str:
        return self.child.buffer

    async def close(self) -> int | None:
        if self.child.isalive():
            self.child.sendline("/quit")
            await asyncio.to_thread(self.child.expect, pexpect.EOF)
        await asyncio.to_thread(self.child.wait)
        return self.child.exitstatus
