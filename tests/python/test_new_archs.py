"""Issue 23's families through flextier.Session (the C session API): the
greedy continuation of every new fixture equals transformers' (recorded in
fixtures.json), in memory and, for the mixtures of experts, with the
experts streamed from disk."""
import json
import os

import pytest

import flextier

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "tests", "data", "models")
NEW = ["qwen3-tiny", "qwen3-sw", "phi3-tiny", "phi3-sw", "gemma2-tiny", "gemma3-tiny", "mixtral-tiny", "qwen2moe-tiny",
       "qwen3moe-tiny", "olmoe-tiny"]


@pytest.mark.parametrize("name", NEW)
def test_greedy_equals_transformers(name, tmp_path):
    d = os.path.join(MODELS, name)
    fx = json.load(open(os.path.join(d, "fixtures.json")))
    kws = [dict(kv_dtype="f32")]
    if "moe" in name or "mixtral" in name:
        kws.append(dict(kv_dtype="f32", policy="w=0,0,100", disk_dir=str(tmp_path / "disk")))
    for kw in kws:
        with flextier.Session(d, threads=1, **kw) as s:
            assert s.info()["model_type"] in ("qwen3", "phi3", "gemma2", "gemma3_text", "mixtral", "qwen3_moe", "qwen2_moe",
                                              "olmoe")
            got = s.generate_ids(fx["prompts"], len(fx["greedy"][0]), temperature=0, ignore_eos=True)
            assert [list(g) for g in got] == fx["greedy"], (name, kw)
