"""Regenerate the Python code of ``mangonel.proto`` from its ``.proto`` schemas.

Run ``python -m mangonel.proto.generate`` after editing a schema; the
generated ``*_pb2*.py`` / ``.pyi`` files are committed next to it.
``grpc_tools`` (a test dependency) must be installed.

* ``mangonel.proto``: mangonel's own services (messages and gRPC stubs).
* ``flightsql.proto``: the subset of Arrow Flight SQL the scheduler serves
  (messages only: Flight SQL rides on Arrow Flight, served by ``pyarrow.flight``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GRPC_MODULE = HERE / "mangonel_pb2_grpc.py"


def main() -> int:
    """Run protoc on the schemas and make the generated imports package-relative."""
    # Imported here: grpc_tools is only needed at development time.
    from grpc_tools import protoc  # type: ignore[import-untyped,unused-ignore]

    proto_include = str(Path(protoc.__file__).resolve().parent / "_proto")
    runs = [
        [
            f"--python_out={HERE}",
            f"--grpc_python_out={HERE}",
            f"--pyi_out={HERE}",
            "mangonel.proto",
        ],
        [f"--python_out={HERE}", f"--pyi_out={HERE}", "flightsql.proto"],
    ]
    for run in runs:
        args = ["protoc", f"-I{HERE}", f"-I{proto_include}", *run[:-1], str(HERE / run[-1])]
        code = protoc.main(args)
        if code != 0:
            print(f"protoc failed on {run[-1]} with exit code {code}", file=sys.stderr)
            return int(code)
    # protoc writes `import mangonel_pb2 as ...`, which only works when this folder
    # is on sys.path; inside the package it must be relative.
    text = GRPC_MODULE.read_text()
    text = re.sub(r"^import mangonel_pb2 as ", "from . import mangonel_pb2 as ", text, flags=re.M)
    GRPC_MODULE.write_text(text)
    print(f"generated code in {HERE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
