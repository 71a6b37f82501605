"""F32 conversion of a GGUF model for `kvfabric bench engine` (llama.cpp on f32 weights).

Usage: python gguf_to_f32.py SRC.gguf DST.gguf

Every tensor is dequantized with PyPI `gguf` (its numpy reference dequantizers)
and written as F32; all metadata is copied unchanged except `general.file_type`
(set to ALL_F32). The result is cached: DST.sha256 records the sha256 of SRC
and of DST, and a later call whose SRC hash matches and whose DST still hashes
to the recorded value does nothing. Prints one JSON line:
{"path", "sha256", "source_sha256", "converted": bool, "seconds"}.
"""

import hashlib
import importlib.metadata
import json
import os
import sys
import time

import gguf
import numpy as np


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_record(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def convert(src: str, dst: str) -> None:
    reader = gguf.GGUFReader(src)
    arch_field = reader.fields[gguf.Keys.General.ARCHITECTURE]
    arch = arch_field.contents()
    tmp = dst + ".partial"
    writer = gguf.GGUFWriter(tmp, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        # Virtual fields and the ones GGUFWriter writes itself.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        val_type = field.types[0]
        sub_type = field.types[-1] if val_type == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE:
            value = int(gguf.LlamaFileType.ALL_F32)
        writer.add_key_value(field.name, value, val_type, sub_type=sub_type)
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        # Dequantized arrays are (rows, cols) in numpy order; GGUF stores the reverse.
        expected = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        if tuple(data.shape) != expected:
            data = data.reshape(expected)
        writer.add_tensor(tensor.name, data, raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()
    os.replace(tmp, dst)


def main() -> int:
    src, dst = sys.argv[1], sys.argv[2]
    record_path = dst + ".sha256"
    started = time.monotonic()
    source_sha = sha256_of(src)
    record = read_record(record_path)
    converted = False
    if not (
        os.path.exists(dst)
        and record.get("source_sha256") == source_sha
        and record.get("sha256") == sha256_of(dst)
    ):
        print(f"converting {src} to F32 (once; cached at {dst})", file=sys.stderr, flush=True)
        convert(src, dst)
        record = {
            "source": os.path.basename(src),
            "source_sha256": source_sha,
            "sha256": sha256_of(dst),
            "converter": f"gguf {importlib.metadata.version('gguf')}",
        }
        with open(record_path + ".partial", "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
        os.replace(record_path + ".partial", record_path)
        converted = True
    print(json.dumps({
        "path": dst,
        "sha256": record["sha256"],
        "source_sha256": source_sha,
        "converted": converted,
        "seconds": time.monotonic() - started,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
