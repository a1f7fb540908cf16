"""``python -m flextier serve ...``: run a memory node (same options as the
C CLI's ``flextier serve``)."""
import argparse
import sys

from . import parse_size, serve


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flextier")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run a memory node until SIGTERM/SIGINT")
    s.add_argument("--listen", default="127.0.0.1:13337", help="HOST:PORT (port 0: any)")
    s.add_argument("--capacity", required=True, type=parse_size, help="pool size, e.g. 4G")
    s.add_argument("--spill-dir")
    s.add_argument("--spill-capacity", type=parse_size, default=0)
    s.add_argument("--token-file")
    s.add_argument("--max-connections", type=int, default=0)
    s.add_argument("--insecure", action="store_true",
                   help="allow a non-loopback --listen without a token")
    s.add_argument("--trusted-network", action="store_true",
                   help="let UCX carry data over TCP (it trusts every peer)")
    s.add_argument("--overcommit", action="store_true",
                   help="allow a capacity above this machine's memory")
    a = ap.parse_args(argv)

    def ready(bound: str) -> None:
        print(f"flextier serve: listening on {bound}", flush=True)

    serve(a.listen, a.capacity, spill_dir=a.spill_dir, spill_capacity=a.spill_capacity,
          token_file=a.token_file, max_connections=a.max_connections, on_ready=ready,
          insecure=a.insecure, trusted_network=a.trusted_network, overcommit=a.overcommit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
