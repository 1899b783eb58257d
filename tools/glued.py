"""Every glued value of an executed book, and whether two builds' agree: the check that a change of structure left
the book's numbers and sentences as they were (issue 63).

    python tools/glued.py snapshot build/cpu-embedded-committed/book > before.json
    python tools/glued.py diff before.json after.json        # or two book folders

A book folder's executed notebooks (``<book>/notebooks/*.ipynb``, as ``thesis-lib book`` leaves them) hold each
glued value as an output named by its scrapbook record; a snapshot maps notebook -> name -> value, the value being
the record's HTML (a styled table's random id left out), Markdown or text, in that order of preference (or, for an
image or other binary record, its SHA-256). ``diff`` prints how many values each side
holds per notebook and every name whose value differs or exists on one side only, and exits 1 if any does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

PREFIX = "application/papermill.record/"
#: a pandas Styler's table id, random per rendering (``T_`` and five hex digits), and where it recurs
STYLER_ID = re.compile(r"(?<=[\"#])T_[0-9a-f]{5}(?=[_\"' ])")


def values(notebook: dict) -> dict[str, str]:
    """The glued values of one executed notebook (its JSON), by name; a name glued twice keeps its last value."""
    out = {}
    for cell in notebook.get("cells", []):
        for o in cell.get("outputs", []):
            record = o.get("metadata", {}).get("scrapbook")
            if not record:
                continue
            data = {k[len(PREFIX):] if k.startswith(PREFIX) else k: v for k, v in o.get("data", {}).items()}
            # a rendered table's HTML, not its text form (a Styler's repr names its memory address)
            text = next((data[m] for m in ("text/html", "text/markdown", "text/plain") if m in data), None)
            if text is None:  # an image or another binary record: its bytes' hash
                mime, raw = sorted(data.items())[0] if data else ("none", "")
                text = f"{mime} sha256:{hashlib.sha256(json.dumps(raw).encode()).hexdigest()}"
            out[record["name"]] = STYLER_ID.sub("T_", "".join(text) if isinstance(text, list) else text)
    return out


def snapshot(book: Path) -> dict[str, dict[str, str]]:
    """Every executed notebook's glued values in the book folder ``book`` (notebook stem -> name -> value)."""
    notebooks = sorted(Path(book, "notebooks").glob("*.ipynb"))
    if not notebooks:
        raise SystemExit(f"no executed notebooks under {Path(book, 'notebooks')}")
    return {p.stem: values(json.loads(p.read_text(encoding="utf-8"))) for p in notebooks}


def load(path: str) -> dict:
    p = Path(path)
    return snapshot(p) if p.is_dir() else json.loads(p.read_text(encoding="utf-8"))


def diff(a: dict, b: dict) -> list[str]:
    """One line per notebook (values on each side) and one per differing name; empty where nothing differs."""
    lines = []
    for nb in sorted(set(a) | set(b)):
        x, y = a.get(nb, {}), b.get(nb, {})
        bad = sorted(n for n in set(x) | set(y) if x.get(n) != y.get(n))
        lines.append(f"{nb}: {len(x)} and {len(y)} values, {len(bad)} differing")
        for n in bad:
            lines.append(f"  {n}: {x.get(n, '(absent)')!r:.120} -> {y.get(n, '(absent)')!r:.120}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("snapshot", help="print a book folder's glued values as JSON")
    s.add_argument("book")
    d = sub.add_parser("diff", help="compare two snapshots or book folders")
    d.add_argument("a")
    d.add_argument("b")
    args = ap.parse_args(argv)
    if args.cmd == "snapshot":
        print(json.dumps(snapshot(Path(args.book)), indent=1, sort_keys=True))
        return 0
    a, b = load(args.a), load(args.b)
    lines = diff(a, b)
    print("\n".join(lines))
    same = all(line.endswith(" 0 differing") for line in lines if not line.startswith("  "))
    total = sum(len(v) for v in b.values())
    print(f"{'identical' if same else 'DIFFERENT'}: {total} values in {len(b)} notebooks")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
