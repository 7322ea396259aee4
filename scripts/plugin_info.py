#!/usr/bin/env python3
"""Ask a resource plugin binary which version it is (the engine's GetPluginInfo call).

    plugin_info.py PATH   -> prints the version the plugin reports, exit 0

Starts the plugin the way the engine does (it prints its gRPC port on stdout), calls
ResourceProvider.GetPluginInfo with Pulumi's own generated stubs, and stops it. Used by
scripts/toolchain.sh to verify what it installed and by the engine tests.
"""

from __future__ import annotations

import subprocess
import sys


def plugin_version(path: str, timeout: float = 30.0) -> str:
    import grpc
    from google.protobuf import empty_pb2
    from pulumi.runtime.proto import provider_pb2_grpc

    proc = subprocess.Popen([path], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = (proc.stdout.readline() if proc.stdout else "").strip()
        if not port.isdigit():
            raise RuntimeError(f"{path} did not print a gRPC port (got {port!r})")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = provider_pb2_grpc.ResourceProviderStub(channel)
            return str(stub.GetPluginInfo(empty_pb2.Empty(), timeout=timeout).version)
    finally:
        proc.kill()
        proc.wait()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        print(plugin_version(argv[1]))
    except Exception as exc:  # the message is the report
        print(f"plugin_info: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
