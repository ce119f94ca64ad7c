#!/usr/bin/env python3
"""Record llama.cpp's tokenization of a fixed corpus as the reference for xpert's tokenizer.

Loads the vocabulary of a GGUF with llama-cpp-python (`pip install llama-cpp-python`, module
`llama_cpp`, vocab_only) and writes, for every corpus string and every (add_bos, parse_special)
combination, the token ids llama.cpp produces, plus llama.cpp's own detokenization of them, and the
piece of every token that appears (and of a sample of the whole vocabulary) with special on and off.

Texts and pieces are stored as hex, because some cases are deliberately invalid UTF-8.

    python3 tests/reference/make_tokenizer_fixtures.py \
        [--model models/gemma3-270m.gguf] [--out tests/reference/fixtures/tokenizer_default.json]

tests/unit/test_tokenizer_reference.cpp replays the file against src/text/.
"""
import argparse
import ctypes
import json
import os
import random

import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def corpus():
    """(name, bytes) pairs. Names are stable so a failing case is easy to find."""
    c = [
        ("empty", ""),
        ("single_space", " "),
        ("single_newline", "\n"),
        ("hello", "Hello world"),
        ("hello_punct", "Hello, world! How are you today?"),
        ("leading_space", " Hello"),
        ("leading_spaces", "   Hello"),
        ("trailing_space", "Hello "),
        ("trailing_spaces", "Hello    "),
        ("both_spaces", "  padded on both sides  "),
        ("sentence", "The quick brown fox jumps over the lazy dog."),
        ("contractions", "I'm sure they'll say it's what we'd've done, isn't it?"),
        ("chinese", "你好，世界！今天天气很好，我们去公园散步吧。"),
        ("japanese", "こんにちは世界。東京は日本の首都です。カタカナとひらがな。"),
        ("korean", "안녕하세요, 세계! 오늘 날씨가 좋네요."),
        ("arabic", "مرحبا بالعالم"),
        ("hindi", "नमस्ते दुनिया"),
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
        ("newlines_run", "para one\n\n\npara two\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\nend"),
        ("tabs_run", "\t\t\tindented\t\tand\ttabs" + "\t" * 35),
        ("mixed_ws", " \t \n \r\n\t\t  \n\n  \t"),
        ("crlf", "line one\r\nline two\r\n"),
        ("digits", "0123456789 12345678901234567890"),
        ("numbers", "Pi is 3.14159, e is 2.71828; 1,000,000 and 1e-9 and -42 and 0x1F."),
        ("dates", "2024-01-15T10:30:00Z, 12/31/1999, 3:45pm"),
        ("mixed_scripts", "English 中文 日本語 한국어 Русский العربية हिन्दी 🌍"),
        ("urls", "See https://example.com/path?q=1&r=two#frag or mailto:a@b.co"),
        ("html", "<html><body><h1>Title</h1><p>Text with <b>bold</b> and <i>it</i>.</p><table><tr><td>1</td></tr></table></body></html>"),
        ("html_partial", "<tabl <table <table> </td </td> <b><b></b></b>"),
        ("turn_markers", "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n"),
        ("bos_literal", "<bos>Hello <bos> world<eos>"),
        ("special_soup", "<pad><unk><mask>[multimodal]<start_of_image><end_of_image><unused0><unused6241></s><s>"),
        ("special_adjacent", "<end_of_turn><end_of_turn>\n\n<start_of_turn>"),
        ("special_in_word", "abc<start_of_turn>def</s>ghi"),
        ("angle_brackets", "a < b > c <> <<>> <start_of_turn"),
        ("underscore_block", "snake_case and ▁ literal lower-one-eighth ▁▁ blocks"),
        ("repeated_char", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
        ("repeated_word", "the the the the the the the the the the the the"),
        ("punctuation", "!!!???...,,,;;;:::---___===+++***&&&%%%$$$###@@@"),
        ("quotes", "\"double\" 'single' `back` «guillemets» „low“ “curly” ‘single’"),
        ("control_chars", "a\x00b\x01c\x07d\x1be\x7f"),
        ("long_word", "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism"),
        ("latin_ext", "Łódź, Český Krumlov, Şanlıurfa, Reykjavík, Tromsø"),
        ("thai", "สวัสดีครับ ภาษาไทย"),
        ("hebrew_rtl_mixed", "שלום world עולם 123"),
        ("bom", "\ufeffBOM at start"),
        ("nbsp", "non\u00a0breaking\u2009thin\u3000ideographic"),
        ("private_use", "\ue000\uf8ff\U000f0000"),
    ]
    out = [(n, s.encode("utf-8")) for n, s in c]
    # Invalid UTF-8: lone continuation bytes, truncated sequences, overlong forms, bytes never valid.
    out += [
        ("invalid_lone_continuation", b"ab\x80cd\xbf"),
        ("invalid_truncated_3byte", b"x\xe4\xbdy"),
        ("invalid_truncated_at_end", b"end\xe4\xbd"),
        ("invalid_lead_at_end", b"end\xf0"),
        ("invalid_ff_fe", b"\xff\xfe\xfd text"),
        ("invalid_overlong", b"\xc0\xaf and \xe0\x80\xaf"),
        ("invalid_surrogate", b"\xed\xa0\x80\xed\xbf\xbf"),
        ("invalid_mixed", "ok 中".encode() + b"\x9f\x98" + " 😀 ".encode() + b"\xf0\x9f" + b"tail"),
    ]
    return out


LONG_TEXT_BYTES = 256 << 10


def fnv1a_ids(ids):
    """FNV-1a (64-bit) over the ids as little-endian int32: a checksum the C++ test recomputes."""
    h = 0xCBF29CE484222325
    for i in ids:
        for b in (i & 0xFFFFFFFF).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def random_cases(vocab_texts, vocab_types, seed=1234, count=16, length=300):
    """Strings glued from random vocabulary pieces, user-defined tokens and stray bytes: they exercise
    merge orders and score ties that hand-written text rarely reaches."""
    rng = random.Random(seed)
    normal = [i for i, t in enumerate(vocab_types) if t == 1]
    special = [i for i, t in enumerate(vocab_types) if t in (3, 4)]
    cases = []
    for k in range(count):
        parts = []
        for _ in range(length):
            r = rng.random()
            if r < 0.85:
                parts.append(vocab_texts[rng.choice(normal)].replace("\u2581".encode(), b" "))
            elif r < 0.93:
                parts.append(vocab_texts[rng.choice(special)])
            elif r < 0.97:
                parts.append(bytes([rng.randrange(256)]))
            else:
                parts.append(b" " * rng.randrange(1, 40))
        cases.append((f"random_{k}", b"".join(parts)))
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "default.gguf"))
    ap.add_argument("--out", default=os.path.join(HERE, "fixtures", "tokenizer_default.json"))
    args = ap.parse_args()

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(args.model.encode(), params)
    if not model:
        raise SystemExit(f"cannot load {args.model}")
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

    def tokenize(text, add_bos, special):
        cap = len(text) + 16
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(vocab, text, len(text), buf, cap, add_bos, special)
        assert n >= 0, n
        return list(buf[:n])

    def piece(tok, special):
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(vocab, tok, buf, len(buf), 0, special)
        assert 0 <= n <= len(buf), n
        return buf.raw[:n]

    def detokenize(ids, special):
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        cap = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, cap, False, special)
        assert 0 <= n <= cap, n
        return buf.raw[:n]

    # Raw token texts (as stored in the GGUF) and types, for the random cases only.
    texts = [llama_cpp.llama_vocab_get_text(vocab, i) for i in range(n_vocab)]
    attrs = [llama_cpp.llama_vocab_get_attr(vocab, i) for i in range(n_vocab)]
    # attr bits (llama.h): 1 unknown, 2 unused, 4 normal, 8 control, 16 user-defined, 32 byte.
    types = [4 if a & 16 else 3 if a & 8 else 6 if a & 32 else 1 if a & 4 else 0 for a in attrs]

    cases = []
    used = set()
    for name, text in corpus() + random_cases(texts, types):
        entry = {"name": name, "hex": text.hex()}
        for add_bos in (False, True):
            for special in (False, True):
                ids = tokenize(text, add_bos, special)
                used.update(ids)
                key = f"ids_bos{int(add_bos)}_sp{int(special)}"
                entry[key] = ids
        ids = entry["ids_bos0_sp1"]
        entry["detok_sp0_hex"] = detokenize(ids, False).hex()
        entry["detok_sp1_hex"] = detokenize(ids, True).hex()
        cases.append(entry)

    # One long text, stored by its recipe (every case above, each followed by a newline, repeated to
    # 256 KiB) and by a checksum of the ids: it tests long inputs and how cases interact at their
    # seams without growing the file.
    joined = b"".join(bytes.fromhex(c["hex"]) + b"\n" for c in cases)
    long_text = b""
    while len(long_text) < LONG_TEXT_BYTES:
        long_text += joined
    long_cases = {}
    for special in (False, True):
        ids = tokenize(long_text, False, special)
        long_cases[f"sp{int(special)}"] = {"n_ids": len(ids), "fnv1a_ids": fnv1a_ids(ids)}

    # Pieces: every token seen above, every control / user-defined / byte token, and a stride sample.
    sample = set(used)
    sample.update(i for i, t in enumerate(types) if t in (3, 4, 6) and (i < 1000 or i % 50 == 0 or t == 4))
    sample.update(range(0, n_vocab, 97))
    pieces, sample_attrs = {}, {}
    for i in sorted(sample):
        p0, p1 = piece(i, False), piece(i, True)
        pieces[str(i)] = [p0.hex(), p1.hex()] if p0 != p1 else [p0.hex()]
        sample_attrs[str(i)] = attrs[i]

    eog = [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    out = {
        "generator": "tests/reference/make_tokenizer_fixtures.py",
        "llama_cpp_python": llama_cpp.__version__,
        "model": os.path.basename(args.model),
        "n_vocab": n_vocab,
        "bos": llama_cpp.llama_vocab_bos(vocab),
        "eos": llama_cpp.llama_vocab_eos(vocab),
        "eot": llama_cpp.llama_vocab_eot(vocab),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "eog": eog,
        "long_text": {"min_bytes": LONG_TEXT_BYTES, **long_cases},
        "cases": cases,
        "pieces": pieces,
        "attrs": sample_attrs,  # llama_token_attr bits after llama.cpp's fix-ups
    }
    with open(args.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    llama_cpp.llama_model_free(model)
    print(f"{args.out}: {len(cases)} cases, {len(pieces)} pieces, {os.path.getsize(args.out)} bytes")


if __name__ == "__main__":
    main()
