#!/usr/bin/env python3
"""Dev-only cross-check of tokenizer.c: builds the model's Hugging Face tokenizer
(BPE + Digits(individual) + ByteLevel, as SmolLM2's tokenizer.json) from the GGUF metadata
with the `tokenizers` package and prints the ids of a file, one per line.
Usage: python3 dev/ref_tokenize.py MODEL.gguf TEXTFILE > ids.txt   (pip install gguf tokenizers)"""
import sys
from gguf import GGUFReader
from tokenizers import Tokenizer, models, pre_tokenizers, decoders

r = GGUFReader(sys.argv[1])
f = r.fields["tokenizer.ggml.tokens"]
toks = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
m = r.fields["tokenizer.ggml.merges"]
merges = [tuple(bytes(m.parts[i]).decode("utf-8").split(" ", 1)) for i in m.data]
tk = Tokenizer(models.BPE({t: i for i, t in enumerate(toks)}, merges))
tk.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Digits(individual_digits=True),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
tk.decoder = decoders.ByteLevel()
text = open(sys.argv[2], encoding="utf-8").read()
for i in tk.encode(text, add_special_tokens=False).ids:
    print(i)
