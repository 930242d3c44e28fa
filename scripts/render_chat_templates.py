#!/usr/bin/env python3
"""Regenerates tests/data/chat_templates/expected.json: every template in that
folder rendered on every chat of cases.json by Python's Jinja, configured as
transformers' apply_chat_template configures it, so that the C++ interpreter
(text/jinja) is tested against the renderer the models were trained with.

Needs jinja2 (3.1). Run from the repository root:
    python3 scripts/render_chat_templates.py
The special tokens per template are kept from the existing expected.json.
"""
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

FOLDER = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "chat_templates")
FIXED_NOW = datetime.datetime(2024, 7, 26, 0, 0, 0)  # what strftime_now() reads in the tests


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = FIXED_NOW.strftime
    cases = json.load(open(os.path.join(FOLDER, "cases.json"), encoding="utf-8"))
    expected_path = os.path.join(FOLDER, "expected.json")
    expected = json.load(open(expected_path, encoding="utf-8"))
    for name, entry in expected.items():
        source = open(os.path.join(FOLDER, name + ".jinja"), encoding="utf-8", newline="").read()
        template = env.from_string(source)
        entry["renders"] = {}
        for case in cases:
            context = dict(messages=json.loads(json.dumps(case["messages"])),
                           add_generation_prompt=case["add_generation_prompt"],
                           bos_token=entry["bos_token"], eos_token=entry["eos_token"],
                           tools=case.get("tools"), documents=None)
            context.update(case.get("kwargs", {}))
            try:
                entry["renders"][case["name"]] = template.render(**context)
            except Exception:  # the template refuses this chat: null
                entry["renders"][case["name"]] = None
    with open(expected_path, "w", encoding="utf-8") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False)
    print(f"jinja2 {jinja2.__version__}: {len(expected)} templates x {len(cases)} chats",
          file=sys.stderr)


if __name__ == "__main__":
    main()
