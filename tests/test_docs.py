"""The docs site builds with MkDocs in strict mode (warnings, broken internal links and anchors are errors)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")
pytest.importorskip("nbformat")


def _load_hook():
    spec = importlib.util.spec_from_file_location("fpsim_docs_hook", ROOT / "docs" / "_hooks" / "notebooks.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    # Notebooks are rendered without executing them here: tests/test_notebooks.py executes them.
    env = dict(os.environ, FPSIM_DOCS_EXECUTE="0")
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    assert (site / "index.html").is_file()
    assert (site / "getting-started" / "index.html").is_file()
    # The API reference is generated from the docstrings.
    api = (site / "api" / "rounding" / "index.html").read_text(encoding="utf-8")
    assert "analyze" in api and "RoundingReport" in api
    # Every notebook has a rendered page.
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        page = site / "notebooks" / nb.stem / "index.html"
        assert page.is_file(), f"no page rendered for {nb.name}"


def test_every_docs_page_is_in_the_nav():
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml may use python-specific tags (none today); ignore unknown tags rather than fail.
    _Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    cfg = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_Loader)

    def walk(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for x in node:
                yield from walk(x)
        elif isinstance(node, dict):
            for v in node.values():
                yield from walk(v)

    in_nav = set(walk(cfg["nav"]))
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    missing = sorted(p for p in pages - in_nav if not p.startswith("_"))
    assert not missing, f"docs pages not in mkdocs.yml nav: {missing}"
    dangling = sorted(p for p in in_nav - pages if p.endswith(".md"))
    assert not dangling, f"nav entries without a page: {dangling}"


def test_notebook_page_renders_outputs(tmp_path):
    """The hook turns an executed notebook into Markdown with its text and figure outputs."""
    import nbformat

    hook = _load_hook()
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# A tiny notebook\n\nSome *text*."),
        nbformat.v4.new_code_cell("print('hello <world>')"),
        nbformat.v4.new_code_cell("1 + 1"),
    ]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="hello <world>\n")]
    nb.cells[2].outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "2"}, execution_count=1)]
    path = tmp_path / "tiny.ipynb"
    nbformat.write(nb, path)
    md = hook.render(path, execute=False)
    assert "# A tiny notebook" in md
    assert "```python\nprint('hello <world>')\n```" in md
    assert "hello &lt;world&gt;" in md  # outputs are escaped, not parsed as HTML
    assert ">2</code></pre>" in md


def test_doctest_blocks_become_code():
    """Docstring examples outside fences render as code, not as Markdown block quotes."""
    import markdown

    hook = _load_hook()
    md = markdown.Markdown(extensions=["fenced_code", hook._doctest_extension()])
    src = "Text with :func:`fpsim.round`.\n>>> [round(v, 2) for v in x]\n[0.1, 0.2]\n\nAfter.\n\n```python\n>>> kept\n```\n"
    html = md.convert(src)
    assert "<blockquote>" not in html
    assert "<code>fpsim.round</code>" in html
    assert html.count("<pre>") == 2 and "&gt;&gt;&gt; [round(v, 2) for v in x]\n[0.1, 0.2]" in html
    assert "<p>After.</p>" in html


@pytest.mark.parametrize("page", ["index.md", "getting-started.md", "split-precision.md", "golden-vectors.md",
                                  "reveal-order.md"])
def test_examples_in_pages_run(page):
    """The ``>>>`` examples of the hand-written pages are doctests (state carries over between blocks)."""
    import doctest
    import re

    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL) if ">>>" in b]
    assert blocks, f"{page} has no examples"
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    globs: dict = {}
    for i, block in enumerate(blocks):
        test = parser.get_doctest(block, globs, f"{page}[{i}]", page, 0)
        runner.run(test, clear_globs=False)
        globs = test.globs
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} example(s) failed in {page}"
