"""A tiktoken-backed tokenizer class in the shape Kimi-K2.5 ships (``tokenization_kimi.py``), written for tests.

This file is copied *into* the remote-code test snapshot and loaded by transformers
through ``auto_map`` (``trust_remote_code=True``), exactly as Moonshot's own file is;
it is our code, not theirs. Ordinary text is encoded by a ``tiktoken.Encoding`` built
from the snapshot's ``tiktoken.model`` (base64 token bytes and rank per line);
special tokens come from ``added_tokens_decoder`` in ``tokenizer_config.json`` and are
split off by transformers before tiktoken sees the text.
"""

from __future__ import annotations

import base64
import os
import shutil
from typing import Any

import tiktoken
from transformers import PreTrainedTokenizer

# Splits text into pieces that BPE merges stay inside (letters, digits in threes, punctuation, spaces).
PIECE_PATTERN = (
    r"""[^\r\n\p{L}\p{N}]?\p{L}+(?:'[a-zA-Z]+)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def read_ranks(path: str) -> dict[bytes, int]:
    """``tiktoken.model``: one ``base64(token bytes) rank`` per line."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _byte_names() -> dict[int, str]:
    """A printable character per byte, so a token's bytes read as one string (the byte-level BPE convention)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    names, extra = {}, 0
    for b in range(256):
        if b in printable:
            names[b] = chr(b)
        else:
            names[b] = chr(256 + extra)
            extra += 1
    return names


class TikTokenTokenizer(PreTrainedTokenizer):
    """Kimi-style tokenizer: tiktoken BPE for text, ``added_tokens_decoder`` for the control tokens."""

    vocab_files_names = {"vocab_file": "tiktoken.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file: str, added_tokens_decoder: dict | None = None, **kwargs: Any) -> None:
        self.vocab_file = vocab_file
        ranks = read_ranks(vocab_file)
        specials = {str(getattr(t, "content", t)): int(i) for i, t in (added_tokens_decoder or {}).items()}
        self._encoding = tiktoken.Encoding(name="kimi-test", pat_str=PIECE_PATTERN, mergeable_ranks=ranks, special_tokens=specials)
        self._names = _byte_names()
        self._bytes_of = {v: k for k, v in self._names.items()}
        self._id_to_str = {rank: "".join(self._names[b] for b in token) for token, rank in ranks.items()}
        self._str_to_id = {s: i for i, s in self._id_to_str.items()}
        super().__init__(added_tokens_decoder=added_tokens_decoder, **kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self._id_to_str)

    def get_vocab(self) -> dict[str, int]:
        return {**self._str_to_id, **self.added_tokens_encoder}

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        return [self._id_to_str[i] for i in self._encoding.encode_ordinary(text)]

    def _convert_token_to_id(self, token: str) -> int:
        return self._str_to_id[token]

    def _convert_id_to_token(self, index: int) -> str:
        return self._id_to_str[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        data = bytearray()
        for token in tokens:
            if token in self.added_tokens_encoder:
                data += token.encode("utf-8")
            else:
                data += bytes(self._bytes_of[c] for c in token)
        return data.decode("utf-8", errors="replace")

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        target = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + "tiktoken.model")
        if os.path.abspath(target) != os.path.abspath(self.vocab_file):
            shutil.copyfile(self.vocab_file, target)
        return (target,)
