"""MkDocs hook: render the course notebooks (``notebooks/*.ipynb``) as pages of the site, and show
doctest examples in docstrings as code.

Each notebook becomes ``notebooks/<name>.md``, generated in memory at build time (nothing is written to
the source tree). With ``FPSIM_DOCS_EXECUTE=1`` (the default) the notebook is executed first with
nbclient, so the page shows real outputs and figures; ``FPSIM_DOCS_EXECUTE=0`` renders the committed
cells only (the test suite does this: it executes the notebooks separately). A notebook that raises
fails the build.

The "Notebooks" entry of ``nav`` in mkdocs.yml is filled with the notebooks found, in file-name order,
titled by each notebook's first heading.

Doctest blocks (``>>>`` lines and their output) outside fenced code would otherwise be read as Markdown
block quotes (and ``[a][b]`` in their output as links); a small Markdown preprocessor, added to the
site's extensions (and so to mkdocstrings' rendering of docstrings), fences them as ``pycon`` code and
shows Sphinx roles (``:func:`x```) as inline code.
"""

from __future__ import annotations

import html
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.notebooks")

_NB_DIR = "notebooks"  # relative to the directory holding mkdocs.yml
_OUT_DIR = "notebooks"  # relative to docs_dir
_TIMEOUT_S = 600


def _root(config: Any) -> Path:
    return Path(config["config_file_path"]).resolve().parent


def _notebooks(config: Any) -> list[Path]:
    return sorted((_root(config) / _NB_DIR).glob("*.ipynb"))


def _title(nb: Any, fallback: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return fallback


def _doctest_extension() -> Any:
    import re

    from markdown import Extension
    from markdown.preprocessors import Preprocessor

    fence_re = re.compile(r"^\s*(```|~~~)")
    # Sphinx roles in docstrings (:func:`x`, :class:`~a.B`) shown as inline code.
    role_re = re.compile(r":(?:func|class|meth|data|mod|attr|obj|exc|const):`~?([^`]+)`")

    class _Doctest(Preprocessor):
        def run(self, lines: list[str]) -> list[str]:
            out: list[str] = []
            fence: str | None = None
            i = 0
            while i < len(lines):
                line = lines[i]
                m = fence_re.match(line)
                if fence is not None:
                    if m and m.group(1) == fence:
                        fence = None
                    out.append(line)
                    i += 1
                    continue
                if m:
                    fence = m.group(1)
                    out.append(line)
                    i += 1
                    continue
                stripped = line.lstrip()
                if stripped.startswith(">>>"):
                    indent = line[: len(line) - len(stripped)]
                    block = []
                    while i < len(lines) and lines[i].strip():
                        block.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].strip())
                        i += 1
                    if out and out[-1].strip():
                        out.append("")
                    out.extend([indent + "```pycon", *[indent + b for b in block], indent + "```", ""])
                    continue
                out.append(role_re.sub(r"`\1`", line))
                i += 1
            return out

    class DoctestExtension(Extension):
        def extendMarkdown(self, md: Any) -> None:
            # After whitespace normalisation (30), before fenced code (25).
            md.preprocessors.register(_Doctest(md), "fpsim_doctest", 28)

    return DoctestExtension()


def _event_priority(p: int) -> Any:
    try:
        from mkdocs.plugins import event_priority

        return event_priority(p)
    except ImportError:  # pragma: no cover - older mkdocs
        return lambda f: f


@_event_priority(100)  # before mkdocstrings reads the extension list
def on_config(config: Any) -> Any:
    import nbformat

    config["markdown_extensions"].append(_doctest_extension())

    entries = []
    for path in _notebooks(config):
        nb = nbformat.read(path, as_version=4)
        entries.append({_title(nb, path.stem): f"{_OUT_DIR}/{path.stem}.md"})
    nav = config.get("nav")
    if nav:
        for i, item in enumerate(nav):
            if isinstance(item, dict) and "Notebooks" in item:
                nav[i] = {"Notebooks": [{"About the course": "notebooks.md"}, *entries]}
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    execute = os.environ.get("FPSIM_DOCS_EXECUTE", "1") != "0"
    for path in _notebooks(config):
        text = render(path, execute=execute)
        files.append(File.generated(config, f"{_OUT_DIR}/{path.stem}.md", content=text))
    return files


def render(path: Path, *, execute: bool) -> str:
    """The Markdown page for one notebook (executed first when ``execute``)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    if execute:
        from nbclient import NotebookClient

        log.info("executing %s", path.name)
        # The kernel inherits the environment; CI may set MPLBACKEND=Agg, which would draw figures
        # without displaying them. The inline backend (headless too) puts them in the outputs.
        env_backend = os.environ.get("MPLBACKEND")
        os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        try:
            NotebookClient(nb, timeout=_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
        finally:
            if env_backend is None:
                os.environ.pop("MPLBACKEND", None)
            else:
                os.environ["MPLBACKEND"] = env_backend
    parts = [
        f"<!-- generated from notebooks/{path.name} by docs/_hooks/notebooks.py; edit the notebook -->\n",
        f"*This page is the notebook `notebooks/{path.name}`"
        + (", executed when the site was built.*\n" if execute else " (outputs not rendered in this build).*\n"),
    ]
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            parts.append(cell.source + "\n")
        elif cell.cell_type == "code":
            if cell.source.strip():
                parts.append("```python\n" + cell.source.rstrip() + "\n```\n")
            for out in cell.get("outputs", []):
                parts.append(_output(out))
    return "\n".join(p for p in parts if p)


def _output(out: Any) -> str:
    kind = out.get("output_type")
    if kind == "stream":
        return _pre(out.get("text", ""))
    if kind == "error":
        return _pre("\n".join([f"{out.get('ename')}: {out.get('evalue')}"]))
    data = out.get("data", {})
    if "image/png" in data:
        b64 = data["image/png"].replace("\n", "")
        return f'<img alt="figure" src="data:image/png;base64,{b64}">\n'
    if "image/svg+xml" in data:
        return '<div class="nb-output">' + data["image/svg+xml"] + "</div>\n"
    if "text/html" in data:
        return '<div class="nb-output">\n' + data["text/html"] + "\n</div>\n"
    if "text/markdown" in data:
        return data["text/markdown"] + "\n"
    if "text/plain" in data:
        return _pre(data["text/plain"])
    return ""


def _pre(text: str) -> str:
    # Raw HTML, not a fenced block: outputs may contain backticks, and must not be parsed as Markdown.
    return '<pre class="nb-output"><code>' + html.escape(text.rstrip("\n")) + "</code></pre>\n"
