"""Regenerate docs/api.md from the docstrings of widelimit's public API.

    python docs/gen_api.py
"""

from __future__ import annotations

import inspect
from pathlib import Path

import widelimit


def main():
    out = ["# API reference", "",
           "Generated from the docstrings by `python docs/gen_api.py`; shapes follow docs/theory.md",
           "(X `(N, n)`, Z `(N, k)`, W `(k, n)` with atoms as rows, b `(n,)`).", ""]
    by_module: dict[str, list[str]] = {}
    for name in sorted(widelimit.__all__):
        obj = getattr(widelimit, name)
        mod = getattr(obj, "__module__", "widelimit")
        by_module.setdefault(mod, []).append(name)
    for mod in sorted(by_module):
        out += [f"## `{mod}`", ""]
        for name in by_module[mod]:
            obj = getattr(widelimit, name)
            try:
                sig = str(inspect.signature(obj))
            except (TypeError, ValueError):
                sig = ""
            kind = "class" if inspect.isclass(obj) else "function"
            out += [f"### `widelimit.{name}{sig}`", "", f"*{kind}*", "", "```text", inspect.getdoc(obj) or "", "```", ""]
    Path(__file__).with_name("api.md").write_text("\n".join(out))


if __name__ == "__main__":
    main()
