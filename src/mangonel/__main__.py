"""``python -m mangonel``: the command line (see ``mangonel.client.cli``)."""

from __future__ import annotations

from mangonel.client.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
