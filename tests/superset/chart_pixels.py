"""What a chart's screenshot holds: how much of it is colour, and which colours.

Run with Superset's Python (it has Pillow; the project's environment does not):
``python chart_pixels.py SCREENSHOT.png`` prints a JSON object: ``colored`` (the share
of pixels that are clearly coloured: the spread of their R, G and B over 40, which the
grey page, grey or black text and white background never reach) and ``colors`` (the share of
each coloured RGB value, rounded to 16 levels, for the ten most common).
"""

from __future__ import annotations

import json
import sys
from collections import Counter

from PIL import Image


def main(path: str) -> None:
    image = Image.open(path).convert("RGB")
    pixels = list(image.getdata())
    colored = Counter(
        (r // 16 * 16, g // 16 * 16, b // 16 * 16)
        for r, g, b in pixels
        if max(r, g, b) - min(r, g, b) > 40
    )
    total = len(pixels)
    print(
        json.dumps(
            {
                "colored": sum(colored.values()) / total,
                "colors": [[list(rgb), n / total] for rgb, n in colored.most_common(10)],
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
