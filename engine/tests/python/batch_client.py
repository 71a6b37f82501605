"""The batch API driven by the official `openai` Python client.

Run by tests/batch_api.rs against a `kvfabric engine` it started:
    python batch_client.py BASE_URL MODEL
Uploads a JSONL file (client.files.create), creates a batch
(client.batches.create), polls it (retrieve), reads the output file
(files.content) and checks each result against the same request sent
interactively. Exits non-zero (an AssertionError) on the first failed check.
"""
import io
import json
import sys
import time

import openai

BASE, MODEL = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused")

bodies = {}
lines = []
for i in range(6):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Name one use of a cache, number {i}."}],
        "max_tokens": 12,
        "temperature": 0 if i % 2 == 0 else 0.7,
    }
    if i % 2:
        body["seed"] = 7 + i
    bodies[f"c{i}"] = body
    lines.append(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}))

f = client.files.create(file=("in.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")
assert f.purpose == "batch" and f.bytes > 0, f
b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
assert b.status == "validating", b
deadline = time.time() + 300
while b.status not in ("completed", "failed", "cancelled"):
    assert time.time() < deadline, b
    time.sleep(0.2)
    b = client.batches.retrieve(b.id)
assert b.status == "completed", b
assert b.request_counts.total == 6 and b.request_counts.completed == 6, b.request_counts
assert any(x.id == b.id for x in client.batches.list(limit=5).data)
out = client.files.content(b.output_file_id).text.strip().splitlines()
assert len(out) == 6, out
for line in out:
    r = json.loads(line)
    want = client.chat.completions.create(**bodies[r["custom_id"]])
    got = r["response"]["body"]["choices"][0]["message"]["content"]
    assert got == want.choices[0].message.content, (r["custom_id"], got, want)
print("ok batch via the openai client")
