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
    args = ap.parse_args()

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


if __name__ == "__main__":
    main()
