"""`xpert template` and `xpert chat` end to end on the small test model (Gemma 3 270M, whose file has no template:
the built-in Gemma 3 template is used)."""
import json
import subprocess

from conftest import XPERT


def test_template_renders_gemma_turns(xpert, model, tmp_path):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi! How can I help?"},
        {"role": "user", "content": "What is 2+2?"},
    ]
    f = tmp_path / "messages.json"
    f.write_text(json.dumps(messages))
    r = xpert("template", "-m", model, "--messages", f, "--add-generation-prompt")
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert out.startswith("<bos><start_of_turn>user\nBe brief.\n\nHello<end_of_turn>\n"), out
    assert "<start_of_turn>model\nHi! How can I help?<end_of_turn>\n" in out
    assert out.endswith("<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"), out

    r = xpert("template", "-m", model, "--messages", f)
    assert r.returncode == 0 and not r.stdout.decode().endswith("<start_of_turn>model\n")


def test_template_bad_messages_is_one_error_line(xpert, model, tmp_path):
    f = tmp_path / "bad.json"
    f.write_text("{not json")
    r = xpert("template", "-m", model, "--messages", f)
    assert r.returncode == 1
    err = r.stderr.decode()
    assert err.startswith("xpert: error:") and "not valid JSON" in err and err.count("\n") == 1, err


def test_chat_answers_and_exits(model):
    r = subprocess.run([str(XPERT), "chat", "-m", str(model), "-n", "8", "--temp", "0", "-t", "2"],
                       input=b"Hello\n/exit\n", capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().strip(), r.stderr.decode()


def test_chat_two_turns_reuses_the_cache(model):
    r = subprocess.run([str(XPERT), "-v", "chat", "-m", str(model), "-n", "6", "--temp", "0", "-t", "2"],
                       input=b"Hello\nAnd again?\n", capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode()
    err = r.stderr.decode()
    line = next(l for l in err.splitlines() if "reused from the cache" in l)
    reused = int(line.split("chat: ")[1].split()[0])
    assert reused > 0, err
