"""Regenerate the preset table of ``docs/devices.md`` from the registry (``fpsim.mma.preset_table``).

The table sits between the markers ``<!-- devices-table:start -->`` and ``<!-- devices-table:end -->``;
everything else in the page is hand-written. ``tests/test_mma_devices.py`` fails when the table is stale.

Usage::

    python tools/update_devices_doc.py          # rewrite the table
    python tools/update_devices_doc.py --check  # exit 1 if it is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "devices.md"
START, END = "<!-- devices-table:start -->", "<!-- devices-table:end -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table() -> str:
    sys.path.insert(0, str(ROOT))
    from fpsim.mma import preset_table

    lines = ["| device | arch | inputs → outputs | provenance | caveats | checked by tests here | source |",
             "|---|---|---|---|---|---|---|"]
    for r in preset_table():
        io = "—" if r["input"] is None else f"{r['input']} → {r['output']}" + (f" (`{r['path']}`)" if r["path"] else "")
        tests = ", ".join(f"`{t.split('::')[-1]}`" for t in r["tests"]) or "—"
        src = r["source"] or r["note"]
        cav = "; ".join(r["caveats"]) or "—"
        lines.append(f"| {r['device']} | {_cell(r['arch'])} | {io} | {_cell(r['provenance'])} | {_cell(cav)} | "
                     f"{_cell(tests)} | {_cell(src)} |")
    return "\n".join(lines)


def render(text: str) -> str:
    head, sep, rest = text.partition(START)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"{DOC}: markers {START} ... {END} not found")
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    old = DOC.read_text()
    new = render(old)
    if "--check" in argv:
        if new != old:
            print(f"{DOC.relative_to(ROOT)} is out of date: run python tools/update_devices_doc.py")
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
