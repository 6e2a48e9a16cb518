"""Would the LM task gain from training a population's members as one batched model, as the control
and toy tasks do? Times, side by side in one process (the order alternating round by round), the
tiny GPT-2's block stack at the LM task's size (``task=lm_summarize``: 2 layers, 128 wide, 4 heads,
the word vocabulary) run for ``P`` members one after another against one pass over the members'
stacked weights (``torch.bmm``; the same code at ``P = 1`` is the lone side), at the shapes a
``claim_c19`` member runs:

* ``update``: a minibatch's forward and backward (2 prompts x 8 samples: 384 token rows, as 24
  sequences of 16);
* ``scoring``: the teacher-forced forward and backward of a whole batch (1536 token rows);
* ``decode``: one sampling step of the batch's 64 rows against an 80-token KV cache (no grad).

The members' weights are the stand-in's, not the harness's model (the harness has no batched LM
pass); as a yardstick the script also times the harness's own teacher-forced pass
(:func:`harness.models.lm.response_forward` of the SFT-shaped model, forward and backward) on the
``update`` minibatch. A ratio near 1 means the arithmetic, not the per-operation overhead, sets the
time: batching members saves nothing there. ``--docs`` writes the table into docs/lm.md's
``lm-population`` block.

    python benchmarks/lm_population.py [--population 10] [--rounds 5] [--docs]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.models.lm import Responses, TinyArch, response_forward, tiny_causal_lm  # noqa: E402
from harness.tasks.lm.corpus import vocabulary  # noqa: E402
from harness.tasks.lm.tokenizer import build_word_tokenizer  # noqa: E402

LAYERS, WIDTH, HEADS = 2, 128, 4  # harness/conf/task/lm_summarize.yaml's lm.arch
PROMPT, RESPONSE, GROUP = 64, 16, 8  # lm.max_prompt_len, lm.max_response_len, group_size
SHAPES = {"update": (24, 16, True), "scoring": (96, 16, True), "decode": (64, 1, False)}  # sequences, tokens, grad


def stacked(P: int, vocab: int, seed: int = 0):
    """``P`` members' weights, stacked on a leading dimension."""
    g = torch.Generator().manual_seed(seed)
    w = lambda *shape: (0.02 * torch.randn(P, *shape, generator=g)).requires_grad_()  # noqa: E731
    blocks = [dict(qkv=w(WIDTH, 3 * WIDTH), proj=w(WIDTH, WIDTH), fc=w(WIDTH, 4 * WIDTH), out=w(4 * WIDTH, WIDTH),
                   ln1=torch.ones(P, 1, WIDTH, requires_grad=True), ln2=torch.ones(P, 1, WIDTH, requires_grad=True))
              for _ in range(LAYERS)]
    return blocks, w(WIDTH, vocab)


def block_stack(blocks, head, h: torch.Tensor, P: int, B: int, T: int, cache=None) -> torch.Tensor:
    """GPT-2's pre-norm blocks on ``h [P, B*T, WIDTH]`` (members never mix), then the head's
    log-normaliser summed: causal attention within each sequence, or (``cache``) one new token
    against that layer's cached keys and values."""
    hd = WIDTH // HEADS
    for i, b in enumerate(blocks):
        a = F.layer_norm(h, (WIDTH,)) * b["ln1"]
        q, k, v = torch.bmm(a, b["qkv"]).view(P * B, T, 3, HEADS, hd).permute(2, 0, 3, 1, 4)
        if cache is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            o = F.scaled_dot_product_attention(q, cache[i][0], cache[i][1])
        h = h + torch.bmm(o.transpose(1, 2).reshape(P, B * T, WIDTH), b["proj"])
        m = F.layer_norm(h, (WIDTH,)) * b["ln2"]
        h = h + torch.bmm(F.gelu(torch.bmm(m, b["fc"]), approximate="tanh"), b["out"])
    return torch.bmm(h, head).logsumexp(-1).sum()


def one_pass(P: int, shape: str, vocab: int):
    """A callable running ``shape`` once for ``P`` members on stacked weights."""
    B, T, grad = SHAPES[shape]
    blocks, head = stacked(P, vocab)
    x = torch.randn(P, B * T, WIDTH, generator=torch.Generator().manual_seed(1))
    if grad:
        return lambda: block_stack(blocks, head, x, P, B, T).backward()
    cache = [tuple(torch.randn(P * B, HEADS, PROMPT + RESPONSE, WIDTH // HEADS) for _ in range(2)) for _ in blocks]

    def step():
        with torch.no_grad():
            block_stack(blocks, head, x, P, B, T, cache)
    return step


def harness_pass(vocab: int):
    """The harness's own teacher-forced pass (shared prompts, packed) of an SFT-shaped GPT-2 on the
    ``update`` minibatch, forward and backward."""
    model = tiny_causal_lm(vocab, 0, 1, PROMPT + RESPONSE, TinyArch(LAYERS, WIDTH, HEADS))
    g = torch.Generator().manual_seed(2)
    prompts = torch.randint(2, vocab, (2, PROMPT), generator=g).repeat_interleave(GROUP, 0)
    responses = torch.randint(2, vocab, (2 * GROUP, RESPONSE), generator=g)
    ones = lambda x: torch.ones_like(x, dtype=torch.long)  # noqa: E731
    return lambda: response_forward(model, Responses(prompts, ones(prompts), responses, ones(responses)),
                                    share_prompts=True).logp.sum().backward()


def seconds(fn, reps: int) -> float:
    for _ in range(2):
        fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--population", type=int, default=10, help="members P")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds of (lone x P, batched)")
    ap.add_argument("--docs", action="store_true", help="write the table into docs/lm.md's lm-population block")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    vocab = len(build_word_tokenizer(vocabulary()))
    P = args.population
    rows = []
    for shape in SHAPES:
        reps = 40 if SHAPES[shape][2] else 200
        lone_fn, batch_fn = one_pass(1, shape, vocab), one_pass(P, shape, vocab)
        lone, batched = [], []
        for r in range(args.rounds):
            order = [("lone", lone_fn), ("batched", batch_fn)]
            for name, fn in order if r % 2 == 0 else order[::-1]:
                (lone if name == "lone" else batched).append(seconds(fn, reps if name == "lone" else max(reps // P, 4)))
        ratios = [b / (a * P) for a, b in zip(lone, batched)]
        rows.append((shape, statistics.median(lone), statistics.median(batched), statistics.median(ratios),
                     min(ratios), max(ratios)))
    yard = statistics.median(seconds(harness_pass(vocab), 40) for _ in range(args.rounds))
    lines = [f"| shape | one member (ms) | {P} members one after another (ms) | {P} members batched (ms) "
             f"| batched / one after another (median, range) |", "| --- | --- | --- | --- | --- |"]
    for shape, lone, batched, ratio, lo, hi in rows:
        lines.append(f"| {shape} | {lone * 1e3:.2f} | {lone * P * 1e3:.1f} | {batched * 1e3:.1f} "
                     f"| {ratio:.2f} ({lo:.2f}-{hi:.2f}) |")
    lines += ["", f"Yardstick: the harness's own teacher-forced pass on the `update` minibatch, forward and backward, "
                  f"{yard * 1e3:.2f} ms (the stand-in's: {rows[0][1] * 1e3:.2f} ms). Medians of {args.rounds} "
                  f"alternating rounds, one torch thread, torch {torch.__version__}."]
    text = "\n".join(lines)
    print(text)
    if args.docs:
        from harness.docs import write_block
        print(f"wrote {write_block('docs/lm.md', 'lm-population', text)}")


if __name__ == "__main__":
    main()
