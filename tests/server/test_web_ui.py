"""The chat page at GET /, used as a person would: Debian's Chromium, headless, driven by Playwright.

Playwright drives the system Chromium through executable_path (`playwright install` is never run: its
browser downloads are not available here). XPERT_CHROMIUM overrides the browser binary. A screenshot of
a two-turn conversation goes to build/web_ui.png. Answers the model cannot be made to give (reasoning, tool
calls, hostile HTML) come from a canned SSE stream that the browser receives in place of the server's.
"""
import json
import os
import pathlib
import re
import shutil

import pytest
import requests

from conftest import ROOT

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # scripts/setup.sh installs it
    sync_playwright = None

SCREENSHOT = ROOT / "build" / "web_ui.png"
TIMEOUT_MS = 30_000
CHAT = "/v1/chat/completions"

STORE_KEY = "xpert.chats.v1"
# Debian's files the page loads from /web/ (src/server/web_ui.cpp).
ASSETS = {
    "/web/marked.min.js": "/usr/share/javascript/marked/marked.min.js",
    "/web/purify.min.js": "/usr/share/nodejs/dompurify/dist/purify.min.js",
    "/web/highlight.min.js": "/usr/share/javascript/highlight.js/highlight.min.js",
    "/web/highlight.css": "/usr/share/javascript/highlight.js/styles/github.css",
}

# Every change of the log: the text length of the last answer and whether Stop was enabled at that moment.
RECORDER = """
window.__answers = [];
addEventListener('DOMContentLoaded', () => {
  const log = document.getElementById('log'), stop = document.getElementById('stop');
  new MutationObserver(() => {
    const a = log.querySelectorAll('.msg.assistant'), last = a[a.length - 1];
    if (a.length) window.__answers.push({n: a.length, len: last.querySelector('.content').textContent.length,
                                         stats: last.querySelector('.stats').textContent, busy: !stop.disabled});
  }).observe(log, {childList: true, subtree: true, characterData: true});
});
"""


def chromium_path():
    if os.environ.get("XPERT_CHROMIUM"):
        return os.environ["XPERT_CHROMIUM"]
    # Debian's binary itself: /usr/bin/chromium is a shell wrapper that only adds flags from /etc/chromium.d.
    if pathlib.Path("/usr/lib/chromium/chromium").exists():
        return "/usr/lib/chromium/chromium"
    return shutil.which("chromium")


@pytest.fixture(scope="module")
def browser():
    if sync_playwright is None:
        pytest.fail("the Python package playwright is missing: run scripts/setup.sh")
    exe = chromium_path()
    if not exe:
        pytest.fail("Debian's chromium is missing: run scripts/setup.sh")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True)
        yield b
        b.close()


class ChatPage:
    def __init__(self, page, server):
        self.page, self.server = page, server
        self.problems = []  # console errors and uncaught exceptions
        self.bodies = []  # JSON bodies the page POSTed to /v1/chat/completions
        page.on("console", lambda m: m.type == "error" and self.problems.append(f"{m.text} ({m.location['url']})"))
        page.on("pageerror", lambda e: self.problems.append(f"uncaught: {e}"))
        page.on("request", lambda r: r.url.endswith(CHAT) and self.bodies.append(json.loads(r.post_data)))
        page.add_init_script(RECORDER)
        page.goto(server.url + "/")
        self.input, self.send_btn, self.stop_btn = page.locator("#input"), page.locator("#send"), page.locator("#stop")
        self.answers = page.locator(".msg.assistant .content")

    def settings(self, temperature, max_tokens):
        self.page.fill("#temp", str(temperature))
        self.page.fill("#maxtok", "" if max_tokens is None else str(max_tokens))

    def say(self, text, enter=False):
        self.input.fill(text)
        if enter:
            self.input.press("Enter")
        else:
            self.send_btn.click()

    def expect_idle(self):
        expect(self.stop_btn).to_be_disabled(timeout=TIMEOUT_MS)
        expect(self.send_btn).to_be_enabled()

    def growth(self, n):
        """Lengths the n-th answer had while it streamed (Stop enabled), in order, and the last one it had."""
        recs = [r for r in self.page.evaluate("window.__answers") if r["n"] == n]
        return [r["len"] for r in recs if r["busy"]], recs[-1]["len"]

    def live_stats(self, n):
        """The n-th answer's stats line as it changed while the answer streamed."""
        return [r["stats"] for r in self.page.evaluate("window.__answers") if r["n"] == n and r["busy"]]

    def texts(self, cls):
        sel = ".msg.assistant .content" if cls == "assistant" else ".msg." + cls
        return self.page.locator(sel).all_text_contents()

    def store(self):
        return json.loads(self.page.evaluate(f"localStorage.getItem('{STORE_KEY}')") or "null")

    def stored(self):
        """The current conversation's messages as the page keeps them (the raw text of each answer)."""
        s = self.store()
        return next(c["messages"] for c in s["chats"] if c["id"] == s["current"])

    def titles(self):
        return self.page.locator("#chats .title").all_text_contents()


@pytest.fixture
def chat(browser, server):
    ctx = browser.new_context(viewport={"width": 1100, "height": 720},
                              permissions=["clipboard-read", "clipboard-write"])
    yield ChatPage(ctx.new_page(), server)
    ctx.close()


def api_call(server, messages, max_tokens):  # non-streamed, greedy
    r = requests.post(server.url + CHAT, json={"messages": messages, "temperature": 0, "max_tokens": max_tokens},
                      timeout=60)
    r.raise_for_status()
    return r.json()


def test_page_loads(chat, server):
    p = chat.page
    assert p.title() == "xpert chat"
    expect(p.locator("#model")).to_have_text(server.model_id)  # filled from /v1/models
    chat.expect_idle()
    assert p.locator(".msg").count() == 0
    assert chat.problems == []


STATS = re.compile(r"^\d+ tokens · \d+\.\d t/s · \d+\.\d\d s to first token( · cut at max tokens)?$")


def test_two_turns_stream(chat, server):
    u1 = {"role": "user", "content": "Name three colors."}
    # Evaluated once here, the prompt's rows are in the state cache, so the page's request and the API call
    # below both resume from them and evaluate the last prompt token alone: the same sums, the same greedy
    # tokens. (A cold prompt is evaluated in a chunk; the panel prefill kernels (8+ rows) sum in another
    # order, so a near-tie may go the other way, as in llama.cpp.)
    api_call(server, [u1], 1)
    chat.settings(0, 16)
    chat.say("Name three colors.", enter=True)
    expect(chat.page.locator(".msg.user")).to_have_text(["Name three colors."])
    expect(chat.answers).to_have_count(1)
    expect(chat.answers.first).not_to_have_text("", timeout=TIMEOUT_MS)  # text appears...
    chat.expect_idle()  # ...and the page is ready again when the answer is done
    expect(chat.page.locator(".msg.assistant .stats")).to_have_text(STATS)
    shown = chat.texts("assistant")[0]
    grew, last = chat.growth(1)
    # It grew while streaming. Not necessarily monotonically: rendered Markdown may shrink (a closing `**`).
    assert len(set(grew)) >= 3 and last == len(shown), grew
    live = chat.live_stats(1)  # the speed is shown while the answer streams
    assert any(re.match(r"^\d+ tokens · \d+\.\d t/s · ", x) for x in live), live
    assert chat.bodies == [{"messages": [u1], "stream": True, "stream_options": {"include_usage": True},
                            "temperature": 0, "max_tokens": 16}]
    first = chat.stored()[1]["content"]
    api = api_call(server, [u1], 16)
    assert first == api["choices"][0]["message"]["content"]  # the page put the stream together exactly
    n = api["usage"]["completion_tokens"]
    assert chat.page.locator(".msg.assistant .stats").text_content().startswith(f"{n} tokens ·")  # from usage

    chat.say("And three animals?")
    expect(chat.answers).to_have_count(2)
    expect(chat.answers.nth(1)).not_to_have_text("", timeout=TIMEOUT_MS)
    chat.expect_idle()
    second = chat.texts("assistant")[1]
    grew, last = chat.growth(2)
    assert len(set(grew)) >= 3 and last == len(second), grew
    # The second request carries the conversation so far, the first answer as the model wrote it.
    u2 = {"role": "user", "content": "And three animals?"}
    assert chat.bodies[1]["messages"] == [u1, {"role": "assistant", "content": first}, u2]
    assert second.strip()
    assert chat.texts("user") == ["Name three colors.", "And three animals?"] and chat.texts("error") == []
    assert chat.input.input_value() == ""
    assert chat.titles() == ["Name three colors."]
    SCREENSHOT.parent.mkdir(exist_ok=True)
    chat.page.screenshot(path=str(SCREENSHOT))
    assert chat.problems == []


def test_stop_keeps_the_partial_answer(chat, server):
    chat.settings(0, None)  # no limit: only Stop ends it
    chat.say("Write a long story about a dragon.")
    expect(chat.answers.first).not_to_have_text("", timeout=TIMEOUT_MS)
    chat.stop_btn.click()
    chat.expect_idle()
    expect(chat.page.locator(".msg.assistant .stats")).to_have_text(re.compile(r" · stopped$"))
    partial = chat.stored()[1]["content"]
    assert partial and chat.texts("error") == []
    chat.settings(0, 4)
    chat.say("Thanks.")
    expect(chat.answers).to_have_count(2)
    chat.expect_idle()
    assert [m["content"] for m in chat.bodies[1]["messages"]] == ["Write a long story about a dragon.", partial,
                                                                  "Thanks."]
    assert chat.texts("assistant")[1] and chat.texts("error") == []
    assert chat.problems == []


def test_new_chat_while_streaming(chat, server):
    chat.settings(0, None)
    chat.say("Write a long story about a dragon.")
    expect(chat.answers.first).not_to_have_text("", timeout=TIMEOUT_MS)
    chat.page.click("#new-chat")  # ends the answer in flight; it stays in its own conversation
    chat.expect_idle()
    chat.page.wait_for_timeout(300)  # the aborted stream must not write into the new chat
    assert chat.page.locator(".msg").count() == 0
    chat.settings(0, 4)
    chat.say("Hello.")
    expect(chat.answers).to_have_count(1)
    chat.expect_idle()
    assert chat.bodies[1]["messages"] == [{"role": "user", "content": "Hello."}]
    assert chat.titles() == ["Hello.", "Write a long story about a dragon."]  # the newest first
    dragon = next(c for c in chat.store()["chats"] if c["title"].startswith("Write"))["messages"]
    assert dragon[1]["content"] and dragon[1]["stats"].endswith(" · stopped")
    assert chat.problems == []


def test_server_error_is_shown(chat, server):
    chat.settings(5, 4)  # the field allows typing 5; the server takes 0..2
    chat.say("Name three colors.")
    err = chat.page.locator(".msg.error")
    expect(err).to_have_text(re.compile(r"^Error: 'temperature' must be between 0 and 2"), timeout=TIMEOUT_MS)
    chat.expect_idle()
    assert chat.texts("assistant") == [] and chat.texts("user") == ["Name three colors."]
    assert chat.stored() == []
    # The page still works, and the failed turn is not part of the conversation.
    chat.settings(0, 4)
    chat.say("Name three colors.")
    expect(chat.answers).to_have_count(1)
    expect(chat.answers.first).not_to_have_text("", timeout=TIMEOUT_MS)
    chat.expect_idle()
    assert chat.bodies[1]["messages"] == [{"role": "user", "content": "Name three colors."}]
    assert chat.texts("error") == [err.text_content()]
    # The browser logs the 400 itself; nothing else may be logged.
    assert [m for m in chat.problems if "status of 400" not in m] == [] and len(chat.problems) == 1, chat.problems


# Both default-model candidates (Gemma 3 270M, Qwen2.5-Coder-1.5B) answer this with a Python code block at
# temperature 0; 16 tokens cover the block.
CODE_PROMPT = 'Repeat this code block exactly:\n```python\nprint("hello")\n```'


def test_code_block_reload_and_conversations(chat, server):
    p = chat.page
    chat.settings(0, 16)
    chat.say(CODE_PROMPT)
    chat.expect_idle()
    code = p.locator(".msg.assistant .content .code pre code").first
    expect(code).to_have_text('print("hello")\n', timeout=TIMEOUT_MS)
    assert code.evaluate("e => getComputedStyle(e).fontFamily").startswith("ui-monospace")
    expect(p.locator(".msg.assistant .code span.hljs-string").first).to_have_text('"hello"')  # highlighted
    p.locator(".msg.assistant .code .copy").first.click()
    expect(p.locator(".msg.assistant .code .copy").first).to_have_text("Copied")
    assert p.evaluate("navigator.clipboard.readText()") == 'print("hello")\n'
    html = p.locator(".msg.assistant .content").inner_html()
    stats = p.locator(".msg.assistant .stats").text_content()
    assert STATS.match(stats), stats

    # A reload shows the same conversation, rendered the same, in the same list.
    p.reload()
    expect(p.locator(".msg.user")).to_have_text([CODE_PROMPT])
    expect(p.locator(".msg.assistant .content")).to_have_count(1)
    assert p.locator(".msg.assistant .content").inner_html() == html.replace("Copied", "Copy")
    assert p.locator(".msg.assistant .stats").text_content() == stats
    assert chat.titles() == [CODE_PROMPT[:60]]

    # A second conversation; switching between them shows each one's messages.
    p.click("#new-chat")
    assert p.locator(".msg").count() == 0
    chat.settings(0, 4)
    chat.say("Hello.")
    expect(chat.answers).to_have_count(1)
    chat.expect_idle()
    assert chat.titles() == ["Hello.", CODE_PROMPT[:60]]
    p.locator("#chats .title", has_text="Repeat").click()
    expect(p.locator(".msg.user")).to_have_text([CODE_PROMPT])
    expect(p.locator(".msg.assistant .code")).not_to_have_count(0)
    chat.settings(0, 4)
    chat.say("Thanks.")  # the next turn goes to the conversation shown, with its history
    chat.expect_idle()
    assert [m["content"] for m in chat.bodies[-1]["messages"]][::2] == [CODE_PROMPT, "Thanks."]
    p.locator("#chats .title", has_text="Hello.").click()
    expect(p.locator(".msg.user")).to_have_text(["Hello."])

    # Deleting the conversation shown leaves an empty new chat; the other one stays, also after a reload.
    p.locator("#chats li.current .delete").click()
    assert p.locator(".msg").count() == 0
    assert chat.titles() == [CODE_PROMPT[:60]]
    p.reload()
    expect(p.locator("#chats .title")).to_have_text([CODE_PROMPT[:60]])
    assert p.locator(".msg").count() == 0  # the empty chat was current, and an empty chat is not kept
    assert [c["title"] for c in chat.store()["chats"]] == [CODE_PROMPT[:60]]
    assert chat.problems == []


def chunk(delta=None, finish=None, usage=None):
    c = {"id": "chatcmpl-canned", "object": "chat.completion.chunk", "created": 0, "model": "canned",
         "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage:
        c["usage"] = usage
    return "data: " + json.dumps(c) + "\n\n"


# Markdown of every kind the page renders, and what a model must not be able to do to the page.
CANNED_ANSWER = ("Use `add`:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\n- one\n- two\n\n"
                 "| a | b |\n|---|---|\n| 1 | 2 |\n\n"
                 '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script> '
                 "[click](javascript:window.__pwned=3)")
CANNED_STREAM = "".join(
    [chunk({"role": "assistant", "content": ""}), chunk({"reasoning_content": "The user wants "}),
     chunk({"reasoning_content": "an add function."}),
     chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                            "function": {"name": "get_weather", "arguments": ""}}]}),
     chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
     chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "Paris"}'}}]})] +
    [chunk({"content": CANNED_ANSWER[i:i + 7]}) for i in range(0, len(CANNED_ANSWER), 7)] +
    [chunk({}, "stop"), chunk(usage={"prompt_tokens": 5, "completion_tokens": 42, "total_tokens": 47}),
     "data: [DONE]\n\n"])


def canned(page):
    page.route("**" + CHAT, lambda r: r.fulfill(status=200, content_type="text/event-stream", body=CANNED_STREAM))


def test_markdown_sanitized_reasoning_and_tool_calls(chat):
    p = chat.page
    canned(p)
    chat.say("Show me.")
    chat.expect_idle()
    a = p.locator(".msg.assistant")
    expect(a.locator(".content pre code.language-python")).to_have_text("def add(a, b):\n    return a + b\n")
    assert a.locator(".content pre span.hljs-keyword").all_text_contents() == ["def", "return"]
    assert a.locator(".content p > code").all_text_contents() == ["add"]
    assert a.locator(".content li").all_text_contents() == ["one", "two"]
    assert a.locator(".content th").all_text_contents() == ["a", "b"]
    assert a.locator(".content td").all_text_contents() == ["1", "2"]
    # The model's HTML is text on the page; no element, handler or script URL of its making.
    content = a.locator(".content")
    assert '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>' in content.text_content()
    assert content.locator("img, script").count() == 0
    assert content.locator("a").get_attribute("href") is None and content.locator("a").text_content() == "click"
    p.locator(".content a").click()
    assert p.evaluate("window.__pwned") is None
    # Reasoning and the tool call are folded; opened, they show what was streamed.
    r = a.locator("details.reasoning")
    assert r.get_attribute("open") is None and r.locator("summary").text_content() == "Reasoning"
    expect(r.locator(".text")).to_be_hidden()
    r.locator("summary").click()
    expect(r.locator(".text")).to_have_text("The user wants an add function.")
    t = a.locator("details.tool-call")
    assert t.get_attribute("open") is None and t.locator("summary").text_content() == "Tool call: get_weather"
    t.locator("summary").click()
    expect(t.locator("pre")).to_have_text('{\n  "city": "Paris"\n}')
    assert a.locator(".stats").text_content().startswith("42 tokens")  # from usage
    assert chat.stored()[1] == {"role": "assistant", "content": CANNED_ANSWER,
                                "reasoning": "The user wants an add function.",
                                "tool_calls": [{"name": "get_weather", "arguments": '{"city": "Paris"}'}],
                                "stats": a.locator(".stats").text_content()}
    assert chat.problems == []


def test_plain_text_without_the_libraries(chat):
    p = chat.page
    # What the server answers when the Debian packages are absent (src/server/web_ui.cpp).
    p.route("**/web/*", lambda r: r.fulfill(status=404, content_type="text/plain", body="missing"))
    canned(p)
    p.reload()
    expect(p.locator("#note")).to_have_text("plain text: the server lacks libjs-marked and node-dompurify")
    chat.say("Show me.")
    chat.expect_idle()
    content = p.locator(".msg.assistant .content.plain")
    expect(content).to_have_text(CANNED_ANSWER)  # every character as the model wrote it, ``` included
    assert content.evaluate("e => e.childElementCount") == 0
    assert p.evaluate("window.__pwned") is None
    expect(p.locator(".msg.assistant details.tool-call summary")).to_have_text("Tool call: get_weather")
    assert chat.problems and all("404" in m for m in chat.problems), chat.problems  # the four files


def test_assets_are_debians_files(server):
    for url, path in ASSETS.items():
        r = requests.get(server.url + url, timeout=10)
        assert r.status_code == 200, (url, r.text)
        assert r.content == pathlib.Path(path).read_bytes()
        assert r.headers["Content-Type"].startswith("text/css" if url.endswith(".css") else "text/javascript")
    assert requests.get(server.url + "/web/other.js", timeout=10).status_code == 404
