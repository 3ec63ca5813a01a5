"""A small SSH server for the tests of the SSH runner: runs every command with
/bin/sh and serves SFTP, accepting one client key. Started inside a network
namespace, it stands for a remote machine."""

from __future__ import annotations

import argparse
import asyncio

import asyncssh


async def handle(process: asyncssh.SSHServerProcess) -> None:
    # The whole output is collected before the exit status is sent: a
    # redirection still copying when the channel closes would lose its tail.
    local = await asyncio.create_subprocess_shell(
        process.command or "true",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await local.communicate()
    process.stdout.write(out)
    process.stderr.write(err)
    process.exit(local.returncode or 0)


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("addr")
    p.add_argument("port", type=int)
    p.add_argument("host_key")
    p.add_argument("authorized_keys")
    a = p.parse_args()
    await asyncssh.listen(
        host=a.addr,
        port=a.port,
        server_host_keys=[a.host_key],
        authorized_client_keys=a.authorized_keys,
        process_factory=handle,
        sftp_factory=True,
        encoding=None,
    )
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
