"""The runnable snippets of docs/arithmetic.md produce the outputs shown there."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "arithmetic.md"


def test_arithmetic_md_snippets() -> None:
    text = DOC.read_text(encoding="utf-8")
    src = "\n".join(b for b in re.findall(r"```python\n(.*?)```", text, re.DOTALL) if ">>>" in b)
    test = doctest.DocTestParser().get_doctest(src, {}, "arithmetic.md", str(DOC), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    res = runner.summarize(verbose=False)
    assert res.attempted > 20 and res.failed == 0
