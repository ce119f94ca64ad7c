"""The chat page at GET /, used as a person would: Debian's Chromium, headless, driven by Playwright.

Playwright drives the system Chromium through executable_path (`playwright install` is never run: its
browser downloads are not available here). XPERT_CHROMIUM overrides the browser binary. A screenshot of
a two-turn conversation goes to build/web_ui.png.
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

# Every change of the log: the text length of the last answer and whether Stop was enabled at that moment.
RECORDER = """
window.__answers = [];
addEventListener('DOMContentLoaded', () => {
  const log = document.getElementById('log'), stop = document.getElementById('stop');
  new MutationObserver(() => {
    const a = log.querySelectorAll('.msg.assistant');
    if (a.length) window.__answers.push({n: a.length, len: a[a.length - 1].textContent.length, busy: !stop.disabled});
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
        self.answers = page.locator(".msg.assistant")

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
        """Lengths the n-th answer had while it streamed (Stop enabled), in order."""
        recs = self.page.evaluate("window.__answers")
        return [r["len"] for r in recs if r["n"] == n and r["busy"]]

    def texts(self, cls):
        return self.page.locator(".msg." + cls).all_text_contents()


@pytest.fixture
def chat(browser, server):
    ctx = browser.new_context(viewport={"width": 1100, "height": 720})
    yield ChatPage(ctx.new_page(), server)
    ctx.close()


def api_answer(server, messages, max_tokens):
    r = requests.post(server.url + CHAT, json={"messages": messages, "temperature": 0, "max_tokens": max_tokens},
                      timeout=60)
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


def test_page_loads(chat, server):
    p = chat.page
    assert p.title() == "xpert chat"
    expect(p.locator("#model")).to_have_text(server.model_id)  # filled from /v1/models
    chat.expect_idle()
    assert p.locator(".msg").count() == 0
    assert chat.problems == []


def test_two_turns_stream(chat, server):
    chat.settings(0, 16)
    chat.say("Name three colors.", enter=True)
    expect(chat.page.locator(".msg.user")).to_have_text(["Name three colors."])
    expect(chat.answers).to_have_count(1)
    expect(chat.answers.first).not_to_have_text("", timeout=TIMEOUT_MS)  # text appears...
    chat.expect_idle()  # ...and the page is ready again when the answer is done
    expect(chat.page.locator("#stats")).to_have_text(re.compile(r"^\d+ chunks in \d+\.\d s$"))
    first = chat.texts("assistant")[0]
    grew = chat.growth(1)
    assert len(set(grew)) >= 3 and grew == sorted(grew) and grew[-1] == len(first), grew  # it grew while streaming
    u1 = {"role": "user", "content": "Name three colors."}
    assert chat.bodies == [{"messages": [u1], "stream": True, "temperature": 0, "max_tokens": 16}]
    assert first == api_answer(server, [u1], 16)  # the page put the stream together exactly

    chat.say("And three animals?")
    expect(chat.answers).to_have_count(2)
    expect(chat.answers.nth(1)).not_to_have_text("", timeout=TIMEOUT_MS)
    chat.expect_idle()
    second = chat.texts("assistant")[1]
    grew = chat.growth(2)
    assert len(set(grew)) >= 3 and grew == sorted(grew) and grew[-1] == len(second), grew
    # The second request carries the conversation so far, the first answer as the page showed it.
    u2 = {"role": "user", "content": "And three animals?"}
    assert chat.bodies[1]["messages"] == [u1, {"role": "assistant", "content": first}, u2]
    # Not compared with a second API call: that call resumes from the rows this one left in the state
    # cache and evaluates the prompt's last token alone, where this one evaluated it in a chunk; the panel
    # prefill kernels (8+ rows) sum in another order, so a near-tie may go the other way, as in llama.cpp.
    assert second.strip()
    assert chat.texts("user") == ["Name three colors.", "And three animals?"] and chat.texts("error") == []
    assert chat.input.input_value() == ""
    SCREENSHOT.parent.mkdir(exist_ok=True)
    chat.page.screenshot(path=str(SCREENSHOT))
    assert chat.problems == []


def test_stop_keeps_the_partial_answer(chat, server):
    chat.settings(0, None)  # no limit: only Stop ends it
    chat.say("Write a long story about a dragon.")
    expect(chat.answers.first).not_to_have_text("", timeout=TIMEOUT_MS)
    chat.stop_btn.click()
    chat.expect_idle()
    partial = chat.texts("assistant")[0]
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
    chat.page.click("#clear")  # drops the conversation and ends the answer in flight
    chat.expect_idle()
    chat.page.wait_for_timeout(300)  # the aborted stream must not write into the new chat
    assert chat.page.locator(".msg").count() == 0
    chat.settings(0, 4)
    chat.say("Hello.")
    expect(chat.answers).to_have_count(1)
    chat.expect_idle()
    assert chat.bodies[1]["messages"] == [{"role": "user", "content": "Hello."}]
    assert chat.problems == []


def test_server_error_is_shown(chat, server):
    chat.settings(5, 4)  # the field allows typing 5; the server takes 0..2
    chat.say("Name three colors.")
    err = chat.page.locator(".msg.error")
    expect(err).to_have_text(re.compile(r"^Error: 'temperature' must be between 0 and 2"), timeout=TIMEOUT_MS)
    chat.expect_idle()
    assert chat.texts("assistant") == [] and chat.texts("user") == ["Name three colors."]
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
