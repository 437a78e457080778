"""Continuous batching (llamablock.runtime.batch): a sequence decoded among others computes what it
computes alone.

The reference is EagerEngine, one sequence at a time (itself tested against the uncached model and
transformers). Tiny random models in float32; prompts of different lengths that join at different
steps, prefill in several chunks and leave at different steps, so rows move, shift and compact.
The served formats too: q8 and q4 weights with bfloat16 activations (llamablock.fast.kernels.quant).
Greedy tokens must be identical, and logits equal within LOGIT_RTOL of the largest logit: the batch
changes only the order of float32 sums (padding keys get a softmax weight of exactly 0).
"""

import pytest
import torch
from batch_driver import assert_each_alone, batched
from hf_reference import tiny_hf_model

import llamablock
from llamablock.model import Decoder
from llamablock.presets import preset
from llamablock.runtime.batch import EagerBatchEngine

# float32 keeps about 7 significant digits (epsilon 1.2e-7); summing the same terms in another order
# (a batch's matmul blocks, a wider masked softmax) moves a result by a few epsilons per layer.
LOGIT_RTOL = 1e-5

# (prompt length, new tokens, the step at which the request arrives)
REQUESTS = [(7, 30, 0), (3, 12, 0), (41, 10, 2), (12, 25, 5), (1, 8, 9), (60, 6, 14)]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    tiny_hf_model("llama", n_heads=4, n_kv=2).save_pretrained(d)
    return llamablock.load_pretrained(d)


def _models(llama):
    torch.manual_seed(0)
    small = dict(d_model=64, n_layers=2, d_ff=128)
    # the window bites past 16 tokens
    window = Decoder(preset("llama-2024-small", n_heads=4, n_kv_heads=2, sliding_window=16, **small)).eval()
    post_ln = Decoder(preset("gpt-2017-small", n_heads=4, n_kv_heads=4, **small)).eval()  # learned positions, MHA
    return {"llama": llama, "sliding-window": window, "gpt-2017": post_ln}


def _prompts(vocab: int, requests=REQUESTS) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n, _, _ in requests]


@pytest.mark.parametrize("name", ["llama", "sliding-window", "gpt-2017"])
def test_batched_equals_alone(llama, name):
    model = _models(llama)[name]
    prompts = _prompts(model.cfg.vocab_size)
    got = batched(EagerBatchEngine(model, rows=2, chunk=16), prompts, REQUESTS)
    assert_each_alone(got, model, prompts, REQUESTS, LOGIT_RTOL)


# Prompts under fast.quant.PREFILL_ROWS tokens, each prefilled in one chunk: every matmul then runs
# the same packed kernel, row by row, alone and batched.
QUANT_REQUESTS = [(7, 16, 0), (3, 10, 0), (20, 8, 3), (12, 12, 5)]
# bfloat16 activations keep 8 significant bits (epsilon 7.8e-3): two roundings apart at most.
QUANT_RTOL = 2e-2


@pytest.mark.parametrize("fmt", ["q8", "q4"])
def test_batched_equals_alone_quantized(llama, fmt):
    """The served formats: bfloat16 activations, int8 or int4 weights (llamablock.fast.kernels.quant)."""
    import copy

    from llamablock.fast.kernels.quant import quantize_model

    model = quantize_model(copy.deepcopy(llama).to(torch.bfloat16), fmt)
    prompts = _prompts(model.cfg.vocab_size, QUANT_REQUESTS)
    got = batched(EagerBatchEngine(model, rows=2, chunk=64), prompts, QUANT_REQUESTS)
    assert_each_alone(got, model, prompts, QUANT_REQUESTS, QUANT_RTOL)


def test_prompts_that_arrive_together_are_prefilled_in_one_forward(llama):
    """Short prompts that have not started share one padded forward (their first tokens after one
    prefill); a prompt that would push the group past `chunk` tokens waits for the next one. The
    rows joined this way are the ones test_batched_equals_alone checks against EagerEngine (its
    REQUESTS 0 and 1 arrive together)."""
    engine = EagerBatchEngine(llama, rows=4, chunk=16)
    forwards = []
    hook = llama.register_forward_pre_hook(lambda m, args, kw: forwards.append(args[0].shape), with_kwargs=True)
    try:
        rows = [engine.add(p, 4) for p in ([1, 2, 3], [4, 5, 6, 7, 8], [9] * 5, [10] * 2)]
        joined = engine.prefill_next(rows)
    finally:
        hook.remove()
    assert [r for r, _ in joined] == rows[:3]  # 3 x 5 padded tokens fit in 16; a fourth would make 20
    assert forwards == [torch.Size([3, 5])] and all(lg.shape == (1, llama.cfg.vocab_size) for _, lg in joined)
    assert [r.index for r in rows[:3]] == [0, 1, 2] and engine.cache.length == 5


def test_rows_move_shift_and_grow(llama):
    """The layout operations actually happen in the run above (else the test proves less)."""
    engine = EagerBatchEngine(llama, rows=1, chunk=4)
    engine.FIRST = 8
    short = engine.add([1, 2], 20)
    assert engine.prefill(short) is not None and engine.cache.length == 2
    long = engine.add(list(range(3, 13)), 5)
    while engine.prefill(long) is None:
        pass
    assert engine.cache.length == 10 and engine.cache.capacity >= 2  # shifted right, a row added
    for _ in range(5):
        engine.step(torch.tensor([1, 1]))
    assert engine.cache.max_len >= 16  # grown past FIRST
    engine.remove(long)
    assert engine.rows == [short] and short.index == 0
    engine.remove(short)
    assert engine.cache is None and engine.rows == []  # idle: no cache held


def test_late_key_rope_decodes_one_sequence_at_a_time():
    cfg = preset("llama-2024-small", rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    engine = EagerBatchEngine(Decoder(cfg).eval(), rows=4)
    assert engine.max_rows == 1
    assert engine.prefill(engine.add([1, 2, 3], 4)) is not None
    with pytest.raises(ValueError, match="one at a time|1 sequence at a time"):
        engine.prefill(engine.add([4, 5], 4))
