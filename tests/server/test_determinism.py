"""A request with a seed at temperature 0.8 gives the same tokens and the same log-probabilities, to the
bit, alone, while other requests' prompts are prefilled in the same steps, and resumed from the state cache
(issue #37: AVX-512's prefill kernels summed a row in another order when it shared a batch)."""
import concurrent.futures as cf

import requests

COMPL = "/v1/completions"
SEEDED = {"prompt": "The old lighthouse keeper looked at the sea and", "max_tokens": 16, "temperature": 0.8,
          "seed": 4242, "logprobs": 1}


def ask(server, body):
    r = requests.post(server.url + COMPL, json=body, timeout=300)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["text"], choice["logprobs"]["token_logprobs"], r.json()["usage"]


def test_seeded_text_ignores_traffic_and_cache(server):
    alone_text, alone_lp, _ = ask(server, SEEDED)
    # Long prompts from other clients, prefilled in chunks while the seeded request decodes.
    filler = [{"prompt": f"Story {i}: " + "once upon a time there was a small village by the river. " * 20,
               "max_tokens": 4, "temperature": 0, "logprobs": 1} for i in range(3)]
    with cf.ThreadPoolExecutor(4) as ex:
        others = [ex.submit(ask, server, f) for f in filler]
        busy_text, busy_lp, _ = ex.submit(ask, server, SEEDED).result()
        for o in others:
            o.result()
    again_text, again_lp, usage = ask(server, SEEDED)
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0  # resumed from the cache
    assert busy_text == alone_text
    assert again_text == alone_text
    assert busy_lp == alone_lp
    assert again_lp == alone_lp
