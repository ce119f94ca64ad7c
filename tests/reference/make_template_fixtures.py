#!/usr/bin/env python3
"""Render every template in tests/reference/templates/ over a suite of conversations with Python's
jinja2, set up the way Hugging Face transformers' apply_chat_template sets it up, and record the
expected prompts (or the error, where jinja2 raised) for xpert's chat template tests.

The environment copies transformers' (src/transformers/utils/chat_template_utils.py):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols extension,
a `tojson` filter that is json.dumps(ensure_ascii=False, ...) (no HTML escaping, keys unsorted),
raise_exception and strftime_now globals. strftime_now is pinned to NOW for determinism, and the
template variables are messages, tools, documents=None, add_generation_prompt, bos_token, eos_token
and the conversation's extra variables.

Before rendering, messages are normalized the way xpert's ChatTemplate does it (src/text/chat_template.h):
the template is probed once for content-part support and for object vs string tool-call arguments,
then list contents are joined (when unsupported) and arguments converted. This script implements that
rule itself, so the fixture checks both the rule and the interpreter.

    pip install jinja2
    python3 tests/reference/make_template_fixtures.py [--out tests/reference/fixtures/chat_templates.json]

tests/unit/test_chat_template_reference.cpp replays the file.
"""
import argparse
import copy
import datetime
import json
import os

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
NOW = datetime.datetime(2026, 1, 15, 9, 30, 0, tzinfo=datetime.timezone.utc)

# Special-token text per template family (what transformers passes from special_tokens_map).
TOKENS = {
    "Qwen2.5": ("", "<|im_end|>"),
    "Qwen3": ("", "<|im_end|>"),
    "Qwen3.5": ("", "<|im_end|>"),
    "Gemma-3": ("<bos>", "<eos>"),
    "Llama-3.1-3.3": ("<|begin_of_text|>", "<|eot_id|>"),
    "Llama-3.2": ("<|begin_of_text|>", "<|eot_id|>"),
    "DeepSeek-R1-Distill": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "DeepSeek-V3.1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
}


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(tmpl, bos, eos, messages, tools=None, add_generation_prompt=True, extra=None):
    kwargs = dict(messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt,
                  bos_token=bos, eos_token=eos)
    kwargs.update(extra or {})
    return tmpl.render(**kwargs)


def probe(tmpl, bos, eos):
    """Capabilities, exactly as ChatTemplate::probe decides them."""
    def attempt(messages):
        try:
            return render(tmpl, bos, eos, messages, add_generation_prompt=False)
        except Exception:
            return None

    out = attempt([{"role": "user", "content": [{"type": "text", "text": "xpert-probe-text"}]}])
    content_parts = out is not None and "xpert-probe-text" in out and "'type'" not in out and '"type"' not in out

    def tool_chat(arguments):
        return [{"role": "user", "content": "xpert-probe-question"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_0", "type": "function",
                     "function": {"name": "xpert_probe_fn", "arguments": arguments}}]}]

    out = attempt(tool_chat({"xpert_probe_arg": "xpert-probe-value"}))
    object_ok = out is not None and "xpert-probe-value" in out and "{'xpert_probe_arg'" not in out
    out = attempt(tool_chat('{"xpert_probe_arg": "xpert-probe-value"}'))
    string_ok = out is not None and "xpert-probe-value" in out
    return {"content_parts": content_parts, "object_arguments": object_ok or not string_ok}


def normalize(messages, caps):
    out = copy.deepcopy(messages)
    for m in out:
        if isinstance(m.get("content"), list) and not caps["content_parts"]:
            m["content"] = "\n".join(p["text"] for p in m["content"])
        for call in m.get("tool_calls") or []:
            fn = call.get("function")
            if not isinstance(fn, dict) or "arguments" not in fn:
                continue
            args = fn["arguments"]
            if caps["object_arguments"] and isinstance(args, str):
                try:
                    parsed = json.loads(args)
                except ValueError:
                    parsed = None
                if isinstance(parsed, dict):
                    fn["arguments"] = parsed
            elif not caps["object_arguments"] and not isinstance(args, str):
                fn["arguments"] = json.dumps(args, ensure_ascii=False)
    return out


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city. Use <city> names & 'quotes' sparingly; answers in °C.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Zürich\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": 1},
                "threshold": {"type": "number", "default": 0.5},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "web_search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                        "filters": {"type": "array", "items": {"type": "string"}}},
                       "required": ["query"]},
    },
}
TOOLS = [WEATHER, SEARCH]

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def call(id_, name, arguments):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


def conversations():
    c = []

    def add(name, messages, tools=None, gen=True, extra=None):
        c.append({"name": name, "messages": messages, "tools": tools, "add_generation_prompt": gen,
                  "extra": extra or {}})

    add("single_user", [{"role": "user", "content": "Hello!"}])
    add("system_user", [SYSTEM, {"role": "user", "content": "What is 2+2?"}])
    add("multi_turn", [SYSTEM, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
                       {"role": "user", "content": "Tell me a joke."}])
    add("multi_turn_no_generation_prompt", [{"role": "user", "content": "Hi"},
                                            {"role": "assistant", "content": "Hello there."}], gen=False)
    add("tools_defined", [SYSTEM, {"role": "user", "content": "Weather in Paris?"}], tools=TOOLS)
    add("tool_call_and_result", [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call("call_1", "get_weather", {"city": "Paris", "days": 2})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21, \"unit\": \"°C\"}"},
    ], tools=TOOLS)
    add("tool_call_string_arguments", [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call("call_1", "get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\"}")]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 degrees"},
        {"role": "assistant", "content": "It is sunny and 21 °C in Paris."},
    ], tools=TOOLS, gen=False)
    add("parallel_tool_calls", [
        SYSTEM,
        {"role": "user", "content": "Compare Paris and Rome, then search news."},
        {"role": "assistant", "content": "Let me check both.", "tool_calls": [
            call("call_a", "get_weather", {"city": "Paris", "threshold": 1.5, "flags": [True, None]}),
            call("call_b", "get_weather", {"city": "Rome", "nested": {"a": [1, 2.0, "x"]}})]},
        {"role": "tool", "tool_call_id": "call_a", "content": "Paris: 18"},
        {"role": "tool", "tool_call_id": "call_b", "content": "Rome: 25"},
        {"role": "assistant", "content": "Rome is warmer."},
        {"role": "user", "content": "Thanks!"},
    ], tools=TOOLS)
    add("tool_call_null_content", [
        {"role": "user", "content": "Search for cats"},
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "web_search", {"query": "cats"})]},
        {"role": "tool", "tool_call_id": "c1", "content": "Cats are mammals."},
    ], tools=TOOLS)
    add("reasoning_content", [
        {"role": "user", "content": "What is 17*3?"},
        {"role": "assistant", "reasoning_content": "17*3 = 51.", "content": "51"},
        {"role": "user", "content": "And 17*4?"},
    ])
    add("reasoning_last_turn", [
        {"role": "user", "content": "What is 17*3?"},
        {"role": "assistant", "reasoning_content": "\nMultiply: 17*3 = 51.\n", "content": "\n51"},
    ], gen=False)
    add("think_in_content", [
        {"role": "user", "content": "Say yes."},
        {"role": "assistant", "content": "<think>\nThe user wants yes.\n</think>\n\nYes."},
        {"role": "user", "content": "Again."},
    ])
    add("enable_thinking_false", [{"role": "user", "content": "Quick answer: capital of France?"}],
        extra={"enable_thinking": False})
    add("enable_thinking_true", [{"role": "user", "content": "Think: capital of France?"}],
        extra={"enable_thinking": True, "thinking": True})
    add("content_parts", [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": "Second part."}]},
    ])
    add("special_characters", [
        {"role": "system", "content": "  Use <b>bold</b> & 'quotes' \"here\".  \n"},
        {"role": "user", "content": "Ünïcödé ✓ 日本語 emoji 🎉\ttab\\backslash {{ not a tag }} {% raw %}"},
    ], tools=[WEATHER])
    add("roles_not_alternating", [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}])
    add("system_only", [SYSTEM])
    add("date_and_custom_variables", [{"role": "user", "content": "What day is it?"}],
        extra={"date_string": "01 Feb 2026", "tools_in_user_message": False}, tools=[SEARCH])
    add("empty_conversation", [])
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--templates", default=os.path.join(HERE, "templates"))
    ap.add_argument("--out", default=os.path.join(HERE, "fixtures", "chat_templates.json"))
    ap.add_argument("--features-out", default=os.path.join(HERE, "fixtures", "chat_templates_features.json"))
    args = ap.parse_args()
    write_features(args.features_out)

    env = make_env()
    convs = conversations()
    result = {
        "generator": f"tests/reference/make_template_fixtures.py (jinja2 {jinja2.__version__})",
        "now_unix": int(NOW.timestamp()),
        "conversations": convs,
        "templates": [],
    }
    for fname in sorted(os.listdir(args.templates)):
        if not fname.endswith(".jinja"):
            continue
        name = fname[: -len(".jinja")]
        with open(os.path.join(args.templates, fname), encoding="utf-8") as f:
            source = f.read()
        bos, eos = TOKENS[name]
        tmpl = env.from_string(source)
        caps = probe(tmpl, bos, eos)
        entry = {"name": name, "file": fname, "bos_token": bos, "eos_token": eos, "capabilities": caps,
                 "results": {}}
        n_ok = 0
        for conv in convs:
            messages = normalize(conv["messages"], caps)
            try:
                text = render(tmpl, bos, eos, messages, conv["tools"], conv["add_generation_prompt"], conv["extra"])
                entry["results"][conv["name"]] = {"ok": True, "text": text}
                n_ok += 1
            except Exception as e:  # jinja2 errors and TypeErrors alike: xpert must fail too
                entry["results"][conv["name"]] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        print(f"{name}: {n_ok}/{len(convs)} rendered, caps {caps}")
        result["templates"].append(entry)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {args.out}")


MSGS = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}]

# (name, template, variables): each exercises one interpreter feature against jinja2.
FEATURES = [
    # whitespace control, trim_blocks, lstrip_blocks, comments, raw
    ("ws_minus", "a  {%- if true -%}  b  {%- endif -%}  c", {}),
    ("ws_expr_minus", "a \n {{- 'x' -}} \n b", {}),
    ("ws_trim_blocks", "{% if true %}\nline\n{% endif %}\nend", {}),
    ("ws_lstrip_blocks", "x\n    {% if true %}\n    y\n    {% endif %}\nz", {}),
    ("ws_lstrip_not_midline", "x {% if true %}y{% endif %} z", {}),
    ("ws_plus_disables_lstrip", "x\n    {%+ if true %}y{% endif %}", {}),
    ("ws_plus_disables_trim", "{% if true +%}\ny{% endif %}", {}),
    ("ws_comment", "a\n  {# note #}\nb {#- tight -#}   c", {}),
    ("ws_expr_keeps_newline", "{{ 'a' }}\n{{ 'b' }}\n", {}),
    ("ws_trailing_newline_dropped", "text\n", {}),
    ("ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc", {}),
    ("raw_block", "{% raw %}{{ not evaluated }} {% if %}{% endraw %}!", {}),
    # literals and printing
    ("print_scalars", "{{ none }}|{{ true }}|{{ false }}|{{ 42 }}|{{ -7 }}|{{ 3.0 }}|{{ 'str' }}|{{ undefined_var }}|", {}),
    ("print_floats", "{{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e16 }} {{ 1e15 }} {{ 1e-5 }} {{ 0.0001 }} {{ 2.5e-10 }} {{ -0.0 }} {{ 123.456 }}", {}),
    ("print_containers", "{{ [1, 'a', none, true, 2.5] }} {{ {'k': 'v', 'n': [1]} }} {{ (1, 2) }} {{ (1,) }} {{ [] }} {{ {} }}", {}),
    ("print_repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'nl\\n', 'é'] }}", {}),
    ("string_escapes", "{{ 'a\\tb\\nc\\\\d\\'e' }}|{{ \"\\u00e9\\x41\" }}", {}),
    ("string_concat_literals", "{{ 'a' 'b' \"c\" }}", {}),
    ("numbers_underscore", "{{ 1_000 + 1 }} {{ 1.5e3 }}", {}),
    # operators
    ("arith_int", "{{ 7 + 2 }} {{ 7 - 2 }} {{ 7 * 2 }} {{ 7 / 2 }} {{ 8 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }}", {}),
    ("arith_float", "{{ 1 + 2.0 }} {{ 7.5 % 2 }} {{ -7.5 // 2 }} {{ 1.5 * 2 }} {{ true + 1 }}", {}),
    ("arith_precedence", "{{ 1 + 2 * 3 - 4 / 2 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ 2 * 3 ~ 4 }}", {}),
    ("string_ops", "{{ 'ab' * 3 }} {{ 3 * 'x' }} {{ [1, 2] * 2 }} {{ 'a' + 'b' }} {{ [1] + [2] }} {{ 'n' ~ 1 ~ none ~ true ~ undefined_var }}", {}),
    ("compare", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }} {{ none == none }} {{ undefined_var == none }}", {}),
    ("logic_values", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }}|{{ none or [] }} {{ not 0 }} {{ not 'a' }}", {}),
    ("ternary", "{{ 'y' if 1 else 'n' }} {{ 'y' if 0 else 'n' }} [{{ 'y' if 0 }}] {{ 'a' if false else 'b' if true else 'c' }}", {}),
    ("in_operator", "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ 3 not in [1] }} {{ 'x' in undefined_var }}", {}),
    ("truthiness", "{% for v in [0, 1, '', 'a', [], [0], {}, none, 0.0] %}{{ 'T' if v else 'F' }}{% endfor %}", {}),
    # tests
    ("tests_types", "{% for v in [none, true, 1, 1.5, 'a', [1], {'a': 1}] %}{{ v is none }}{{ v is boolean }}{{ v is integer }}{{ v is float }}{{ v is number }}{{ v is string }}{{ v is mapping }}{{ v is iterable }}{{ v is sequence }};{% endfor %}", {}),
    ("tests_defined", "{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ x.a is defined }} {{ x.b is defined }} {{ none_v.a is defined }} {{ y is iterable }}", {"x": {"a": 1}, "none_v": None}),
    ("tests_true_false", "{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ none is not none }}", {}),
    ("tests_numbers", "{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby(3) }} {{ 10 is divisibleby 3 }}", {}),
    ("tests_compare", "{{ 1 is eq 1 }} {{ 1 is equalto(2) }} {{ 2 is gt 1 }} {{ 1 is lt(0) }} {{ 1 is ne 2 }} {{ 'a' is in 'cat' }} {{ x is sameas x }} {{ 'ab' is lower }} {{ 'AB' is upper }}", {"x": [1]}),
    ("tests_callable", "{{ range is callable }} {{ 1 is callable }}", {}),
    # attribute and subscript access
    ("access", "{{ m.role }} {{ m['role'] }} {{ m.missing }}|{{ l[0] }} {{ l[-1] }} {{ l[5] }}|{{ s[1] }} {{ s[-1] }} {{ m.get('role') }} {{ m.get('x', 'def') }} {{ m.get('x') }}", {"m": {"role": "user"}, "l": [1, 2, 3], "s": "héllo"}),
    ("access_nested", "{{ msgs[2].tool_calls[0].function.name }} {{ msgs[2]['tool_calls'][0]['function']['arguments'] }} {{ msgs[0].content }}", {"msgs": MSGS}),
    ("access_none_attr", "[{{ n.attr }}] [{{ 5.attr }}] [{{ 'str'.nope }}]", {"n": None}),
    ("slicing", "{{ l[::-1] }} {{ l[1:] }} {{ l[:-1] }} {{ l[::2] }} {{ l[1:3] }} {{ l[-2:] }} {{ l[5:] }} {{ l[::-2] }} {{ s[::-1] }} {{ s[1:3] }} {{ s[-3:] }}", {"l": [1, 2, 3, 4, 5], "s": "aé日bc"}),
    # loops
    ("loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}[{{ loop.previtem }}|{{ loop.nextitem }}] {% endfor %}", {}),
    ("loop_else", "{% for x in [] %}x{% else %}empty{% endfor %} {% for x in [1] %}{{ x }}{% else %}empty{% endfor %}", {}),
    ("loop_filtered", "{% for x in range(10) if x is odd %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}", {}),
    ("loop_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {% for k, v in d|items %}{{ k }}{% endfor %} {% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}", {"d": {"z": 1, "a": 2}}),
    ("loop_dict_keys", "{% for k in d %}{{ k }}{% endfor %} {% for k in d.keys() %}{{ k }}{% endfor %} {% for v in d.values() %}{{ v }}{% endfor %}", {"d": {"z": 1, "a": 2}}),
    ("loop_nested", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }};{% endfor %}", {}),
    ("loop_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("loop_cycle", "{% for x in range(4) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}", {}),
    ("loop_undefined_iter", "[{% for x in nothing %}{{ x }}{% endfor %}]", {}),
    ("loop_scoping", "{% set x = 1 %}{% for i in [5, 6] %}{{ x }}{% set x = i %}{{ x }} {% endfor %}{{ x }}", {}),
    ("loop_scoping_fresh", "{% for i in [1, 2, 3] %}[{{ y }}]{% set y = i %}{% endfor %}", {}),
    ("range", "{{ range(3)|list }} {{ range(1, 4)|list }} {{ range(10, 0, -3)|list }} {{ range(0)|list }}", {}),
    # set, namespace, macros
    ("set_forms", "{% set a = 1 %}{% set b, c = 2, 3 %}{% set t = 4, 5 %}{{ a }}{{ b }}{{ c }}{{ t }}", {}),
    ("set_if_leaks", "{% if true %}{% set y = 'in-if' %}{% endif %}{{ y }}", {}),
    ("set_block", "{% set blk %}  Hello {{ name }}!  {% endset %}[{{ blk }}] {% set up | upper | trim %} shout {% endset %}[{{ up }}]", {"name": "Bob"}),
    ("namespace", "{% set ns = namespace(count=0, found=false) %}{% for x in [1, 2, 3] %}{% set ns.count = ns.count + x %}{% if x == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }} {{ ns.missing }}|", {}),
    ("namespace_from_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}", {}),
    ("macro", "{% macro greet(name, greeting='Hello', punct='!') %}{{ greeting }}, {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', 'Hi') }} {{ greet('C', punct='?') }} {{ greet(name='D') }}", {}),
    ("macro_recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}", {}),
    ("macro_sees_globals", "{% set top = 'T' %}{% macro m() %}{{ top }}{{ var }}{% endmacro %}{{ m() }}", {"var": "V"}),
    ("macro_trim_filter", "{% macro m(x) %}\n  {{ x }}  \n{% endmacro %}[{{ m('v')|trim }}]", {}),
    ("call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}inner{% endcall %}", {}),
    ("filter_block", "{% filter upper %}shout {{ 'this' }}{% endfilter %}", {}),
    ("raise_exception", "{{ raise_exception('bad input: ' ~ 3) }}", {}),
    ("strftime_now", "{{ strftime_now('%Y-%m-%d %H:%M %d %b %Y %B %A') }}", {}),
    ("dict_global", "{{ dict(a=1, b='x') }} {{ dict(a=1).a }}", {}),
    # filters
    ("filter_trim_len", "[{{ '  a b  '|trim }}] [{{ 'xxaxx'|trim('x') }}] {{ 'héllo'|length }} {{ [1, 2]|length }} {{ {'a': 1}|count }} {{ nothing|length }}", {}),
    ("filter_case", "{{ 'hello WORLD'|upper }} {{ 'Hello'|lower }} {{ \"hello world-wide (x) it's\"|title }} {{ 'hELLO wORLD'|capitalize }}", {}),
    ("filter_replace_join", "{{ 'a-b-c'|replace('-', '+') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ [1, 2, 3]|join(', ') }} {{ ['a', 'b']|join }} {{ users|join(', ', attribute='name') }}", {"users": [{"name": "x"}, {"name": "y"}]}),
    ("filter_first_last", "{{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} {{ 'abc'|first }} {{ 'abc'|last }} [{{ []|first }}]", {}),
    ("filter_default", "{{ nothing|default('dflt') }} {{ none|default('d') }} {{ ''|default('e', true) }} {{ 0|d('z', boolean=true) }} {{ 'v'|default('w') }} [{{ nothing|default }}]", {}),
    ("filter_conversions", "{{ 3|string }} {{ '12'|int + 1 }} {{ '3.7'|int }} {{ 3.9|int }} {{ 'x'|int }} {{ 'x'|int(-1) }} {{ '0x1A'|int(0, 16) }} {{ '2.5'|float }} {{ 3|float }} {{ 'no'|float }} {{ true|int }}", {}),
    ("filter_list_items", "{{ 'ab'|list }} {{ {'a': 1, 'b': 2}|list }} {{ {'a': 1}|items|list }} {{ nothing|items|list }}", {}),
    ("filter_map_select", "{{ users|map(attribute='name')|list }} {{ users|map(attribute='age', default=0)|list }} {{ ['a', 'b']|map('upper')|list }} {{ users|selectattr('admin')|map(attribute='name')|list }} {{ users|rejectattr('admin')|map(attribute='name')|list }} {{ users|selectattr('name', 'equalto', 'y')|list|length }} {{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('odd')|list }} {{ [0, 1, '', 'a']|select|list }}", {"users": [{"name": "x", "admin": True, "age": 30}, {"name": "y", "admin": False}]}),
    ("filter_unique_sort", "{{ [3, 1, 2, 1]|unique|list }} {{ ['a', 'A', 'b']|unique|list }} {{ [3, 1, 2]|sort }} {{ [3, 1, 2]|sort(reverse=true) }} {{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }} {{ users|sort(attribute='name')|map(attribute='name')|join }}", {"users": [{"name": "y"}, {"name": "x"}]}),
    ("filter_dictsort", "{{ d|dictsort }} {{ d|dictsort(reverse=true) }} {{ d|dictsort(by='value') }}", {"d": {"b": 1, "a": 3, "C": 2}}),
    ("filter_numbers", "{{ 2.5|round }} {{ 3.5|round }} {{ 2.567|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(method='floor') }} {{ 3|round }} {{ -3|abs }} {{ -2.5|abs }} {{ [1, 2, 3]|sum }} {{ [3, 1, 2]|max }} {{ [3, 1, 2]|min }}", {}),
    ("filter_escape_safe", "{{ '<a href=\"x\">&\\'</a>'|escape }} {{ '<b>'|safe }} {{ '<i>'|e }}", {}),
    ("filter_indent", "[{{ 'a\\nb\\n\\nc'|indent }}] [{{ 'a\\nb'|indent(2, true) }}] [{{ 'a\\n\\nb\\n'|indent('> ', blank=true) }}] [{{ 'x\\n'|indent }}]", {}),
    ("filter_reverse_wordcount", "{{ 'abc'|reverse }} {{ [1, 2]|reverse|list }} {{ 'one two  three'|wordcount }}", {}),
    ("filter_tojson", "{{ d|tojson }}", {"d": {"b": "<tag> & 'q' \"dq\" é 日 \n\t\u0001", "a": [1, 2.0, None, True, 1e20, 0.1], "c": {}}}),
    ("filter_tojson_options", "{{ d|tojson(indent=2) }}|{{ d|tojson(sort_keys=true) }}|{{ d|tojson(separators=(',', ':')) }}|{{ d|tojson(ensure_ascii=true) }}|{{ [[]]|tojson(indent=2) }}", {"d": {"z": [1, {"y": "日"}], "a": {}}}),
    ("filter_tojson_tuple", "{{ {'a': 1}|items|list|tojson }}", {}),
    # string methods
    ("str_strip", "[{{ '  x  '.strip() }}] [{{ '  x  '.lstrip() }}] [{{ '  x  '.rstrip() }}] [{{ '\\n\\nx\\n'.strip('\\n') }}] [{{ 'xyhixy'.strip('xy') }}]", {}),
    ("str_split", "{{ 'a,b,,c'.split(',') }} {{ '  a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a</think>b</think>c'.split('</think>')[-1] }} {{ 'k=v=w'.rsplit('=', 1) }}", {}),
    ("str_affixes", "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith('lo') }} {{ 'hello'.startswith(('x', 'h')) }} {{ 'hello'.endswith('x') }}", {}),
    ("str_case_methods", "{{ 'Ab'.upper() }} {{ 'Ab'.lower() }} {{ \"they're bill's-x\".title() }} {{ 'aBC'.capitalize() }}", {}),
    ("str_replace_find", "{{ 'aaa'.replace('a', 'b') }} {{ 'aaa'.replace('a', 'b', 1) }} {{ 'héllo'.find('l') }} {{ 'hello'.find('z') }} {{ 'hello'.rfind('l') }} {{ 'banana'.count('an') }} {{ '-'.join(['a', 'b']) }}", {}),
    ("str_predicates", "{{ '123'.isdigit() }} {{ 'a1'.isdigit() }} {{ 'ab'.isalpha() }} {{ '  '.isspace() }} {{ 'AB'.isupper() }} {{ 'ab'.islower() }}", {}),
    # errors (jinja2 raises; xpert must raise too)
    ("err_undefined_attr", "{{ nothing.attr }}", {}),
    ("err_undefined_item", "{{ nothing['k'] }}", {}),
    ("err_nested_missing", "{{ d.missing.deeper }}", {"d": {}}),
    ("err_add_types", "{{ 'a' + 1 }}", {}),
    ("err_undefined_plus", "{{ nothing + 'a' }}", {}),
    ("err_call_undefined", "{{ nothing() }}", {}),
    ("err_div_zero", "{{ 1 / 0 }}", {}),
    ("err_compare_types", "{{ 1 < 'a' }}", {}),
    ("err_iterate_none", "{% for x in none %}{% endfor %}", {}),
    ("err_set_attr_dict", "{% set d = {} %}{% set d.x = 1 %}", {}),
    ("err_unknown_filter", "{{ 1|no_such_filter }}", {}),
    ("err_unknown_test", "{{ 1 is no_such_test }}", {}),
    ("err_syntax_unclosed", "{% if true %}x", {}),
    ("err_syntax_bad_expr", "{{ 1 + }}", {}),
    ("err_unknown_tag", "{% frobnicate %}", {}),
    ("err_include", "{% include 'other.jinja' %}", {}),
    ("err_tojson_undefined", "{{ nothing|tojson }}", {}),
    ("err_in_none", "{{ 'a' in none }}", {}),
    ("err_unpack", "{% for a, b in [1, 2] %}{% endfor %}", {}),
    ("err_items_not_mapping", "{{ [1]|items|list }}", {}),
]


def write_features(path):
    """One small template per interpreter feature (FEATURES), rendered the same way."""
    env = make_env()
    cases = []
    for name, source, variables in FEATURES:
        case = {"name": name, "template": source, "vars": variables}
        try:
            case["text"] = env.from_string(source).render(**variables)
            case["ok"] = True
        except Exception as e:
            case["ok"] = False
            case["error"] = f"{type(e).__name__}: {e}"
        cases.append(case)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"generator": f"tests/reference/make_template_fixtures.py (jinja2 {jinja2.__version__})",
                   "now_unix": int(NOW.timestamp()), "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path}: {sum(c['ok'] for c in cases)} rendered, {sum(not c['ok'] for c in cases)} raised")


if __name__ == "__main__":
    main()
