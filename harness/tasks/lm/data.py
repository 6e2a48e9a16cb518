"""Datasets (embedded, local JSON/JSONL, or any ``datasets`` hub id) and prompt encoding.

A prompt longer than ``max_prompt_len`` tokens is cut from the **left** (the end of a prompt,
with its "TL;DR:" cue, is what the model must see); every cut is counted, and the trainer
logs the count per iteration (``prompts_truncated``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .corpus import Example, make_corpus

LOCAL_SUFFIXES = (".json", ".jsonl")


class Row(dict):
    """A dataset row that knows where it came from (``line 3`` of a JSONL file, ``row 3`` of a
    JSON list or a hub split), for error messages."""

    where: str = ""


def _row(data: Any, where: str) -> Row:
    if not isinstance(data, dict):
        raise ValueError(f"lm.dataset: {where}: not a JSON object (a {_json_kind(data)})")
    row = Row(data)
    row.where = where
    return row


def _rows_from_file(path: Path) -> dict[str, list] | list:
    """The rows of a local ``.jsonl`` (one JSON object a line) or ``.json`` file (a list of rows,
    or a dict of split -> rows). A file that cannot be read as such is refused with one line
    naming the file and, for a JSONL file, the line."""
    name = repr(str(path))
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise ValueError(f"lm.dataset: {name} line {line}: not UTF-8 text") from None
    except OSError as exc:
        raise ValueError(f"lm.dataset: cannot read {name} ({' '.join(str(exc).split())})") from None
    if not text.strip():
        raise ValueError(f"lm.dataset: {name} is empty (no rows)")
    if path.suffix == ".jsonl":
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"lm.dataset: {name} line {number}: not valid JSON ({exc.msg} at column "
                                 f"{exc.colno})") from None
            rows.append(_row(data, f"{name} line {number}"))
        return rows
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"lm.dataset: {name} line {exc.lineno}: not valid JSON ({exc.msg} at column "
                         f"{exc.colno})") from None
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        # {"train": [...], "validation": [...]}
        return {split: [_row(r, f"{name} split {split!r} row {i + 1}") for i, r in enumerate(rows)]
                for split, rows in data.items()}
    if isinstance(data, list):
        return [_row(r, f"{name} row {i + 1}") for i, r in enumerate(data)]
    raise ValueError(f"lm.dataset: {name} must hold a list of rows or a dict of split -> rows")


def _json_kind(value: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", type(None): "null", int: "number",
            float: "number", dict: "object"}.get(type(value), type(value).__name__)


def _to_examples(rows, columns, source: str) -> list[Example]:
    """Rows -> examples; every row must be an object whose prompt and summary columns hold
    strings (the prompt not blank). Refusals name the file and the line (or row)."""
    pc, sc = columns["prompt"], columns["summary"]
    out = []
    for i, row in enumerate(rows):
        where = getattr(row, "where", "") or f"{source} row {i + 1}"
        if not isinstance(row, dict):
            raise ValueError(f"lm.dataset: {where}: not a JSON object (a {_json_kind(row)})")
        if pc not in row or sc not in row:
            raise ValueError(f"lm.columns: {where} has columns {sorted(map(str, row))}; "
                             f"lm.columns.prompt={pc!r} and lm.columns.summary={sc!r} must both be there")
        for field_name, col in (("lm.columns.prompt", pc), ("lm.columns.summary", sc)):
            if not isinstance(row[col], str):
                raise ValueError(f"lm.dataset: {where}: column {col!r} ({field_name}) must be a string, "
                                 f"got a {_json_kind(row[col])}")
        if not row[pc].strip():
            raise ValueError(f"lm.dataset: {where}: the prompt (column {pc!r}) is blank")
        out.append(Example(prompt=row[pc], reference=row[sc], facts=None))
    return out


def load_examples(lm: Any, seed: int) -> tuple[list[Example], list[Example]]:
    """``(train, held_out)`` for the ``lm`` config node; sizes capped by ``lm.data``."""
    d = lm.data
    if lm.dataset is None:
        return make_corpus(seed, d.train_size, d.eval_size, d.min_facts, d.max_facts,
                           d.min_distractors, d.max_distractors)
    columns = {"prompt": lm.columns.prompt, "summary": lm.columns.summary}
    train_split, eval_split = lm.splits.train, lm.splits.eval
    path = Path(str(lm.dataset)).expanduser()
    if path.is_file():
        data = _rows_from_file(path)
        if isinstance(data, dict):
            if train_split not in data:
                raise ValueError(f"lm.splits.train: {train_split!r} is not a split of {str(path)!r} "
                                 f"(splits: {sorted(data)})")
            if eval_split and eval_split not in data:
                raise ValueError(f"lm.splits.eval: {eval_split!r} is not a split of {str(path)!r} "
                                 f"(splits: {sorted(data)}; null holds out the tail of train)")
            train_rows = data[train_split]
            eval_rows = data[eval_split] if eval_split else None
        else:
            train_rows, eval_rows = data, None
    else:
        try:
            import datasets  # optional dependency
        except ImportError:
            raise ValueError(f"lm.dataset: {lm.dataset!r} is not a local .json/.jsonl file, and loading "
                             "it needs the optional package `datasets` (pip install datasets)") from None
        ds = datasets.load_dataset(str(lm.dataset))
        if train_split not in ds:
            raise ValueError(f"lm.splits.train: {train_split!r} is not a split of {lm.dataset!r} (splits: {list(ds)})")
        train_rows = ds[train_split].select(range(min(len(ds[train_split]), d.train_size + d.eval_size)))
        eval_rows = None
        if eval_split:
            if eval_split not in ds:
                raise ValueError(f"lm.splits.eval: {eval_split!r} is not a split of {lm.dataset!r} (splits: {list(ds)})")
            eval_rows = ds[eval_split].select(range(min(len(ds[eval_split]), d.eval_size)))
    train = _to_examples(list(train_rows), columns, f"{str(lm.dataset)!r} split {train_split!r}")
    if eval_rows is None:  # hold out the tail of the train split
        if len(train) < 2:
            raise ValueError(f"lm.dataset: {lm.dataset!r} has {len(train)} rows; at least 2 are needed")
        n_eval = min(d.eval_size, len(train) // 2)
        train, held = train[:-n_eval], train[-n_eval:]
    else:
        held = _to_examples(list(eval_rows), columns, f"{str(lm.dataset)!r} split {eval_split!r}")[:d.eval_size]
    return train[:d.train_size], held


# --------------------------------------------------------------------------- encoding
@dataclass
class EncodedSplit:
    examples: list[Example]
    prompt_ids: list[list[int]]  # left-truncated to max_prompt_len
    truncated: list[bool]

    def __len__(self) -> int:
        return len(self.examples)


def encode_prompt(tokenizer, text: str, max_len: int) -> tuple[list[int], bool]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) > max_len:
        return ids[len(ids) - max_len:], True
    return ids, False


def encode_split(tokenizer, examples: list[Example], max_prompt_len: int) -> EncodedSplit:
    enc = [encode_prompt(tokenizer, e.prompt, max_prompt_len) for e in examples]
    return EncodedSplit(examples, [ids for ids, _ in enc], [cut for _, cut in enc])


def encode_response(tokenizer, text: str, max_len: int) -> list[int]:
    """Reference response ids ending in EOS; a reference too long keeps its first ``max_len``
    tokens and no EOS (teaching the model to stop early would be worse)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) + 1 <= max_len:
        return ids + [tokenizer.eos_token_id]
    return ids[:max_len]


def left_pad(seqs: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s)
            mask[i, width - len(s):] = 1
    return ids.to(device), mask.to(device)


def right_pad(seqs: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(max(len(s) for s in seqs), 1)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, :len(s)] = torch.tensor(s)
            mask[i, :len(s)] = 1
    return ids.to(device), mask.to(device)


def decode_responses(tokenizer, tokens: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """Response texts without EOS or padding: one ``batch_decode`` of every row's kept ids (the
    tokenizer's ``decode`` of each; a tokenizer attribute such as ``eos_token_id`` is a
    ``__getattr__`` away, so it is read once, not per token)."""
    eos = tokenizer.eos_token_id
    rows = [[t for t, keep in zip(row, m) if keep and t != eos] for row, m in zip(tokens.tolist(), mask.tolist())]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)
