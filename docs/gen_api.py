"""Regenerate docs/api.md from the docstrings of widelimit's public API.

    python docs/gen_api.py
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import widelimit


def main():
    out = ["# API reference", "",
           "Generated from the docstrings by `python docs/gen_api.py`; shapes follow docs/theory.md",
           "(X `(N, n)`, Z `(N, k)`, W `(k, n)` with atoms as rows, b `(n,)`).", ""]
    by_module: dict[str, dict[str, object]] = {}
    for name in sorted(widelimit.__all__):
        obj = getattr(widelimit, name)
        mod = getattr(obj, "__module__", "widelimit")
        by_module.setdefault(mod, {})[f"widelimit.{name}"] = obj
    # public modules whose API is not re-exported at the top level
    for info in pkgutil.walk_packages(widelimit.__path__, prefix="widelimit."):
        parts = info.name.split(".")
        if any(s.startswith("_") for s in parts[1:]) or parts[1] == "cli" or info.ispkg:
            continue
        mod = importlib.import_module(info.name)
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if getattr(obj, "__module__", None) == mod.__name__ and not any(obj is o for o in by_module.get(mod.__name__, {}).values()):
                by_module.setdefault(mod.__name__, {})[f"{mod.__name__}.{name}"] = obj
    for mod in sorted(by_module):
        out += [f"## `{mod}`", ""]
        doc = inspect.getdoc(importlib.import_module(mod)) or ""
        if doc:
            out += [doc.split("\n\n")[0], ""]
        for qual, obj in by_module[mod].items():
            name = qual
            try:
                sig = str(inspect.signature(obj))
            except (TypeError, ValueError):
                sig = ""
            kind = "class" if inspect.isclass(obj) else "function"
            out += [f"### `{name}{sig}`", "", f"*{kind}*", "", "```text", inspect.getdoc(obj) or "", "```", ""]
    Path(__file__).with_name("api.md").write_text("\n".join(out))


if __name__ == "__main__":
    main()
