#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz harnesses into fuzz/corpus/<target>/: small valid files and
near-valid ones, each one step from valid (truncated, a gap, a wrong count, a missing key, ...), so
that the fuzzers start next to every check. Deterministic; the standard library only. The corpus
also holds files octet itself wrote (see fuzz/README.md); this script leaves those alone.

usage: fuzz/make_corpus.py
"""
import json
import os
import struct

ROOT = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(ROOT, "corpus")


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- safetensors: u64 header length, JSON header, data buffer ----

SIZES = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "E8M0": 1, "I32": 4,
         "I64": 8, "U8": 1, "U16": 2}


def safetensors(tensors, metadata=None, pad=True, header=None):
    """tensors: [(name, dtype, shape)]; data is a deterministic byte pattern."""
    h = {}
    if metadata is not None:
        h["__metadata__"] = metadata
    off = 0
    for name, dtype, shape in tensors:
        n = SIZES.get(dtype, 1)
        for d in shape:
            n *= d
        h[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    text = header if header is not None else json.dumps(h, separators=(",", ":"))
    if pad:
        text += " " * ((8 - len(text) % 8) % 8)
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw + bytes((i * 37 + 11) % 256 for i in range(off))


def safetensors_seeds():
    t = "safetensors"
    put(t, "valid_two_f32", safetensors([("a.weight", "F32", [2, 3]), ("b", "F32", [4])],
                                        {"format": "pt"}))
    put(t, "valid_every_dtype", safetensors([("t_" + d, d, [3]) for d in SIZES]))
    put(t, "valid_scalar_and_empty", safetensors([("s", "F32", []), ("e", "BF16", [0, 5]),
                                                  ("z", "U8", [2, 0, 3])]))
    put(t, "valid_fp8_pair", safetensors([("w.weight", "F8_E4M3", [4, 8]),
                                          ("w.weight_scale_inv", "F32", [1, 1])]))
    put(t, "valid_unicode_name", safetensors([("\u00e9\u4e2d.w", "F16", [2])], {"k": "\u00fc"}))
    put(t, "valid_empty_header", safetensors([], header="{}"))
    put(t, "valid_metadata_only", safetensors([], {"format": "pt", "note": "x"}))
    good = safetensors([("a", "F32", [2]), ("b", "I64", [1])])
    put(t, "near_truncated_data", good[:-3])
    put(t, "near_trailing_bytes", good + b"\0\0")
    put(t, "near_short_length", good[:6])
    put(t, "near_length_past_end", struct.pack("<Q", 1 << 20) + good[8:])
    put(t, "near_gap", safetensors([], header='{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}')
        + b"\1" * 8)
    put(t, "near_overlap", safetensors([], header='{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
                                                   '"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}')
        + b"\1" * 3)
    put(t, "near_duplicate_name", safetensors([], header='{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                                         '"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}')
        + b"\1" * 2)
    put(t, "near_bad_dtype", safetensors([("a", "F64", [1])]))
    put(t, "near_size_mismatch", safetensors([], header='{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}')
        + b"\1" * 8)
    put(t, "near_extra_field", safetensors([], header='{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}}')
        + b"\1")
    put(t, "near_metadata_not_string", safetensors([("a", "U8", [1])], {"n": 1}))
    put(t, "near_not_object", safetensors([], header="[1,2,3]"))


# ---- llm.c token shards: 256 x int32 header (magic, version, count), uint16 tokens ----

def shard(tokens, magic=20240520, version=1, count=None):
    header = [magic, version, len(tokens) if count is None else count] + [0] * 253
    return struct.pack("<256i", *header) + struct.pack("<%dH" % len(tokens), *tokens)


def token_shard_seeds():
    t = "token_shard"
    put(t, "valid_bytes", shard([(i * 7) % 257 for i in range(64)]))
    put(t, "valid_gpt2", shard([(i * 7919) % 50257 for i in range(32)]))
    put(t, "valid_empty", shard([]))
    put(t, "near_token_beyond_257", shard([1, 2, 300, 4]))
    put(t, "near_token_65535", shard([65535]))
    put(t, "near_truncated", shard(list(range(10)))[:-2])
    put(t, "near_trailing", shard(list(range(10))) + b"\0\0")
    put(t, "near_llama3_magic", shard(list(range(4)), magic=20240801))
    put(t, "near_version_2", shard(list(range(4)), version=2))
    put(t, "near_negative_count", shard(list(range(4)), count=-1))
    put(t, "near_header_only_short", shard([])[:1000])


# ---- TOML run configs (then NUL-separated --set assignments) ----

def train_config_seeds():
    t = "train_config"
    configs = os.path.join(ROOT, "..", "configs")
    for name in sorted(os.listdir(configs)):
        if name.endswith(".toml"):
            with open(os.path.join(configs, name), "rb") as f:
                put(t, "repo_" + name, f.read())
    put(t, "valid_small", 'steps = 10\nrecipe = "bf16"\n[optim]\nlr = 1e-3\nschedule = "constant"\n'
        '[model]\nhidden_size = 64\nnum_nextn_predict_layers = 0\n')
    put(t, "valid_model_file", '[model]\nconfig = "config.json"\nhidden_size = 96\n')
    put(t, "valid_sets", 'steps = 20\n\0optim.lr=1e-4\0recipe=bf16\0run_dir=runs/x\0'
        'recipe_overrides=["gemm.attn.out=bf16"]\0model.extra={"bos_token_id": 0}')
    put(t, "valid_overrides", 'recipe = "deepseek"\nrecipe_overrides = ["gemm.*=bf16"]\n'
        '[safety]\nspike_action = "rollback"\nspike_window = 10\n')
    put(t, "near_unknown_key", "[optim]\nlrr = 1e-3\n")
    put(t, "near_wrong_type", 'steps = "ten"\n')
    put(t, "near_bad_enum", '[optim]\nschedule = "linear"\n')
    put(t, "near_syntax", "[optim\nlr = 1\n")
    put(t, "near_invalid_value", "steps = 0\n")
    put(t, "near_nested_table", "[model.sub]\nx = 1\n")
    put(t, "near_bad_set", "\0optim.lr\0steps=1.5")
    put(t, "near_bad_recipe", 'recipe = "fp4"\n')


# ---- model.safetensors.index.json ----

def checkpoint_index_seeds():
    t = "checkpoint_index"
    put(t, "near_file_with_slash", json.dumps({"weight_map": {"model.norm.weight": "../x.safetensors"}}))
    put(t, "near_no_weight_map", json.dumps({"metadata": {"total_size": 1}}))
    put(t, "near_not_string", json.dumps({"weight_map": {"a": 3}}))
    put(t, "near_listed_twice", '{"weight_map": {"a": "model-00001-of-00002.safetensors", '
                                '"a": "model-00002-of-00002.safetensors"}}')
    put(t, "near_dotdot", json.dumps({"weight_map": {"a": ".."}}))


# ---- trainer_state.json ----

def trainer_state_seeds():
    t = "trainer_state"
    good = {"step": 6, "tokens_seen": 192, "sampler": [1234, 0, 12, 3000, 16],
            "spike_window": [5.5, 5.25, 5.0]}
    put(t, "valid_compact", json.dumps(good))
    put(t, "valid_negative_seed", json.dumps(dict(good, sampler=[-5, 1, 0, 100, 8], spike_window=[])))
    for key in good:
        put(t, "near_missing_" + key, json.dumps({k: v for k, v in good.items() if k != key}))
    put(t, "near_negative_step", json.dumps(dict(good, step=-1)))
    put(t, "near_step_too_big", json.dumps(dict(good, step=2 ** 63)))
    put(t, "near_sampler_four", json.dumps(dict(good, sampler=[1, 2, 3, 4])))
    put(t, "near_spike_null", json.dumps(dict(good, spike_window=[1.0, None])))
    put(t, "near_not_object", "[]")


if __name__ == "__main__":
    safetensors_seeds()
    token_shard_seeds()
    train_config_seeds()
    checkpoint_index_seeds()
    trainer_state_seeds()
