"""Regenerates tccd/_proto/tcc_pb2.py from proto/tcc/v1/tcc.proto.

    python -m tccd._proto.regen [--check] [--proto-dir DIR]

Needs grpcio-tools. --check exits 1 (and changes nothing) when the
checked-in module differs from what protoc generates now.
"""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKED_IN = os.path.join(HERE, "tcc_pb2.py")
# client/python/tccd/_proto -> repository root
DEFAULT_PROTO_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "..", "..", "proto"))
PROTO_FILE = "tcc/v1/tcc.proto"


def generate(proto_dir=DEFAULT_PROTO_DIR):
    """Returns the bytes protoc --python_out writes for tcc/v1/tcc.proto."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory(prefix="tccd-pb-") as out:
        rc = protoc.main(["protoc", f"-I{proto_dir}", f"--python_out={out}",
                          os.path.join(proto_dir, PROTO_FILE)])
        if rc != 0:
            raise RuntimeError(f"protoc failed on {PROTO_FILE} (exit {rc})")
        with open(os.path.join(out, "tcc", "v1", "tcc_pb2.py"), "rb") as f:
            return f.read()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--proto-dir", default=DEFAULT_PROTO_DIR)
    args = ap.parse_args(argv)
    new = generate(args.proto_dir)
    with open(CHECKED_IN, "rb") as f:
        old = f.read()
    if args.check:
        if old != new:
            print(f"{CHECKED_IN} is stale: run python -m tccd._proto.regen", file=sys.stderr)
            return 1
        return 0
    if old != new:
        with open(CHECKED_IN, "wb") as f:
            f.write(new)
        print(f"wrote {CHECKED_IN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
