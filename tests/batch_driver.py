"""Drive a batch engine as the server's scheduler does, and run the same requests alone: the two
sides of every "batched equals alone" test (tests/runtime/test_batch.py for the eager batch engine,
tests/fast/compiled/test_batch_compiled.py for the compiled one).

    requests: [(prompt length, new tokens, the step at which the request arrives)]
    batched(engine, prompts, requests) -> {i: (greedy tokens, their logits)}
    alone(model, prompt, n)            -> (greedy tokens, their logits), EagerEngine
    assert_each_alone(got, model, prompts, requests, rtol): the same greedy tokens, and logits within
        rtol of the largest logit
"""

import torch

from llamablock.runtime.engine import EagerEngine


@torch.no_grad()
def alone(model, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and the logits that chose them, one sequence through EagerEngine."""
    engine = EagerEngine(model)
    engine.prepare(len(prompt) + n)
    logits = engine.prefill(torch.tensor([prompt]))[0]
    tokens, seen = [], []
    while True:
        seen.append(logits)
        tokens.append(int(logits.argmax()))
        if len(tokens) == n:
            return tokens, seen
        pos = len(prompt) + len(tokens) - 1
        logits = engine.step(torch.tensor([[tokens[-1]]]), pos)[0]


def batched(engine, prompts: list[list[int]], requests) -> dict:
    """Greedy tokens and logits of each request, run as a scheduler runs them: requests arrive at
    their steps; each loop runs one prefill forward (prompts that arrived together as one padded
    batch, else one chunk of the oldest), then decodes one token for every row; a row leaves when
    it has its tokens."""
    out = {i: ([], []) for i in range(len(prompts))}
    waiting, prefilling, step = list(range(len(prompts))), [], 0
    owner = {}

    def took(i, logits):
        out[i][1].append(logits)
        out[i][0].append(int(logits.argmax()))
        return len(out[i][0]) == requests[i][1]

    while waiting or prefilling or engine.rows:
        for i in [i for i in waiting if requests[i][2] <= step]:
            waiting.remove(i)
            row = engine.add(prompts[i], requests[i][1])
            owner[id(row)] = i
            prefilling.append(row)
        if prefilling:
            for row, logits in engine.prefill_next(prefilling):
                prefilling.remove(row)
                if took(owner[id(row)], logits[0]):
                    engine.remove(row)
        if engine.rows:
            tokens = torch.tensor([out[owner[id(r)]][0][-1] for r in engine.rows])
            logits = engine.step(tokens)
            for r, lg in zip(list(engine.rows), logits, strict=True):
                if took(owner[id(r)], lg):
                    engine.remove(r)
        step += 1
    return out


def assert_each_alone(got: dict, model, prompts: list[list[int]], requests, rtol: float) -> None:
    for i, prompt in enumerate(prompts):
        tokens, logits = alone(model, prompt, requests[i][1])
        assert got[i][0] == tokens, f"request {i} ({len(prompt)} prompt tokens): tokens differ"
        worst = max(float((a - b).float().abs().max() / b.float().abs().max())
                    for a, b in zip(got[i][1], logits, strict=True))
        assert worst <= rtol, f"request {i}: logits differ by {worst:.2e} of the largest"
