"""Anthropic's Messages API (/v1/messages) through the official `anthropic` client."""
import pytest
import requests

anthropic = pytest.importorskip("anthropic")
T0 = {"temperature": 0}  # greedy (this client version has no temperature argument)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=120)


def chat_text(server, messages, max_tokens):
    r = requests.post(server.url + "/v1/chat/completions", timeout=60,
                      json={"messages": messages, "max_tokens": max_tokens, "temperature": 0}).json()
    return r["choices"][0]["message"]["content"]


def test_messages_create(claude, server):
    msgs = [{"role": "user", "content": "Write the numbers from 1 to 10."}]
    m = claude.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=msgs, extra_body=T0)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.model == "claude-sonnet-4-5"
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 8 and m.usage.input_tokens > 5
    assert m.content[0].type == "text"
    # The same conversation through the chat API gives the same text.
    assert m.content[0].text == chat_text(server, msgs, 8)


def test_messages_system_and_blocks(claude, server):
    m = claude.messages.create(model="x", max_tokens=6, extra_body=T0, system=[{"type": "text", "text": "Be brief."}],
                               messages=[{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}])
    assert m.content[0].text == chat_text(server, [{"role": "system", "content": "Be brief."},
                                                   {"role": "user", "content": "Say hello."}], 6)
    n = claude.messages.count_tokens(model="x", system="Be brief.", messages=[{"role": "user", "content": "Say hello."}])
    assert n.input_tokens == m.usage.input_tokens


def test_messages_stream(claude, server):
    msgs = [{"role": "user", "content": "Write the numbers from 1 to 10."}]
    with claude.messages.stream(model="x", max_tokens=8, messages=msgs, extra_body=T0) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == final.content[0].text == chat_text(server, msgs, 8)
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8


def test_messages_stream_event_order(server):
    with requests.post(server.url + "/v1/messages", stream=True, timeout=60, json={
            "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as r:
        events = [l.split(": ", 1)[1] for l in r.iter_lines(decode_unicode=True) if l.startswith("event: ")]
    assert events[0] == "message_start"
    assert events.index("content_block_start") < events.index("content_block_delta")
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert "content_block_delta" in events


def test_messages_prefill_and_stop_sequence(claude, server):
    """A last assistant message is continued; a stop sequence ends it with stop_reason stop_sequence."""
    msgs = [{"role": "user", "content": "Count from 1 to 10."}, {"role": "assistant", "content": "1, 2, 3,"}]
    free = claude.messages.create(model="x", max_tokens=12, extra_body=T0, messages=msgs).content[0].text
    assert "," in free, free
    m = claude.messages.create(model="x", max_tokens=12, extra_body=T0, messages=msgs, stop_sequences=["#", ","])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == ","
    # An empty stop sequence stops nothing, and the one reported is still the one that matched.
    e = claude.messages.create(model="x", max_tokens=12, extra_body=T0, messages=msgs, stop_sequences=["", "#", ","])
    assert e.stop_sequence == "," and e.content[0].text == m.content[0].text
    assert m.content[0].text == free[:free.index(",")]


def test_messages_errors(claude, server):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="x", max_tokens=4, messages=[{"role": "robot", "content": "hi"}])
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    r = requests.post(server.url + "/v1/messages", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=10)
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    r = requests.post(server.url + "/v1/messages", data="{", timeout=10)
    assert r.status_code == 400 and r.json()["type"] == "error"

