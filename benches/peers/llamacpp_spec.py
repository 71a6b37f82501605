"""llama.cpp peer of `kvfabric bench spec`, through PyPI llama-cpp-python.

Reads one JSON object on stdin (written by benches/src/spec.rs):
  {"model": PATH, "threads": N, "repeats": R, "max_tokens": M, "n_ctx": C,
   "stop": [ids], "workloads": {NAME: [[prompt ids], ...]}}
and prints one JSON line: per workload, decode tokens/s without a draft model
("plain_tps") and with LlamaPromptLookupDecoding ("pld_tps", its defaults:
max_ngram_size 2, num_pred_tokens 10), and the tokens generated per prompt.
Each prompt is generated greedily (temp 0) until a stop id or M tokens; the
decode rate of a workload is (tokens - 1) summed over its prompts divided by
the time from each prompt's first token to its last, best of R runs, the
same figure kvfabric reports. llama.cpp's log goes to stderr.
"""

import json
import sys
import time

import llama_cpp
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding


def generate(llm, prompt, max_tokens, stop):
    out, first = [], None
    for tok in llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
        now = time.perf_counter()
        if first is None:
            first = now
        if tok in stop:
            break
        out.append(tok)
        last = now
        if len(out) >= max_tokens:
            break
    return out, (len(out) - 1, last - first if out else 0.0)


def measure(job, draft):
    llm = llama_cpp.Llama(
        model_path=job["model"],
        n_ctx=job["n_ctx"],
        n_batch=512,
        n_threads=job["threads"],
        n_threads_batch=job["threads"],
        draft_model=draft,
        # 0.3.36 sizes its scores buffer by this argument (n_batch rows
        # without it) although a draft model turns logits_all on: without
        # it, drafting past position 512 fails with a shape error.
        logits_all=draft is not None,
        verbose=False,
    )
    result = {}
    for name, prompts in job["workloads"].items():
        best, tokens = 0.0, []
        for _ in range(max(1, job["repeats"])):
            n, t, tokens = 0, 0.0, []
            for p in prompts:
                out, (dn, dt) = generate(llm, p, job["max_tokens"], set(job["stop"]))
                n, t = n + dn, t + dt
                tokens.append(out)
            best = max(best, n / t if t > 0 else 0.0)
        result[name] = {"tps": best, "tokens": tokens}
    return result


def main():
    job = json.load(sys.stdin)
    plain = measure(job, None)
    pld = measure(job, LlamaPromptLookupDecoding())
    out = {"llama_cpp_python": llama_cpp.__version__, "workloads": {}}
    for name in job["workloads"]:
        out["workloads"][name] = {
            "plain_tps": plain[name]["tps"],
            "pld_tps": pld[name]["tps"],
            "plain_tokens": plain[name]["tokens"],
            "pld_tokens": pld[name]["tokens"],
        }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
