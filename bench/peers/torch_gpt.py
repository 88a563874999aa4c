"""bench/peers/torch_gpt.py: gpt_bench's training step in PyTorch DTensor under LocalTensorMode.

Run by `scripts/bench --peers` in the venv under build/bench/peers (PyTorch >= 2.10, CPU only);
prints one JSON object. The workload mirrors bench/gpt_bench.cpp (examples/gpt_model.h): a GPT of
2 layers, d_model 256, 8 heads, sequence 128, batch 8, byte vocabulary 256, F32, dropout 0.1,
trained with tensor + sequence parallelism on a (dp=2, tp=4) mesh of 8 ranks simulated in one
process (LocalTensorMode(8), the fake process group): the token table split by rows over tp
(vocabulary parallel), q, k, v and the first MLP weight column-wise, the output projections
row-wise, activations between them sharded along the sequence over tp, the output layer
column-wise and the loss under loss_parallel (vocabulary-parallel cross-entropy). One step:
forward, backward, clip_grad_norm_(1.0), AdamW. Attention is written out (q k^T, causal mask,
softmax, @ v) as gpt_model.h's does it.

Figures: `local_tensor_ms`, the median of 3 timed steps after one warm-up step under
LocalTensorMode; `single_ms`, the same step on full tensors in eager PyTorch (one device); under
"gpt" for the shape above (gpt_bench's BM_gpt_step), under "gpt_toy" for the example's own shape,
d_model 64, 4 heads, sequence 32 (BM_gpt_step_toy).
  python torch_gpt.py [--layers 2 --d-model 256 --heads 8 --seq 128 --batch 8]
"""

import argparse
import json
import math
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import loss_parallel

RANKS = 8


def build_params(cfg, mesh, gen):
    """Parameters as (tensor, placements over (dp, tp)); mesh None: plain tensors."""
    d, v, s, layers = cfg.d_model, cfg.vocab, cfg.seq, cfg.layers
    std, out_std = 0.02, 0.02 / math.sqrt(2 * layers)
    R = [Replicate(), Replicate()]
    col, col_bias, row = [Replicate(), Shard(1)], [Replicate(), Shard(0)], [Replicate(), Shard(0)]

    def p(shape, placements, scale=None, fill=0.0):
        t = torch.randn(shape, generator=gen) * scale if scale else torch.full(shape, fill)
        if mesh is not None:
            t = distribute_tensor(t, mesh, placements)
        return t.requires_grad_()

    params = {"wte": p((v, d), row, std), "wpe": p((s, d), R, std), "blocks": []}
    for _ in range(layers):
        params["blocks"].append({
            "ln1_w": p((d,), R, fill=1.0), "ln1_b": p((d,), R),
            "wq": p((d, d), col, std), "wk": p((d, d), col, std), "wv": p((d, d), col, std),
            "wo": p((d, d), row, out_std), "bo": p((d,), R),
            "ln2_w": p((d,), R, fill=1.0), "ln2_b": p((d,), R),
            "w1": p((d, 4 * d), col, std), "b1": p((4 * d,), col_bias),
            "w2": p((4 * d, d), row, out_std), "b2": p((d,), R)})
    params["lnf_w"] = p((d,), R, fill=1.0)
    params["lnf_b"] = p((d,), R)
    params["head"] = p((d, v), col, std)
    return params


def flat(params):
    out = [params["wte"], params["wpe"]]
    for b in params["blocks"]:
        out += list(b.values())
    return out + [params["lnf_w"], params["lnf_b"], params["head"]]


def forward(cfg, params, tokens, mask, parallel):
    B, S, d, H = cfg.batch, cfg.seq, cfg.d_model, cfg.heads
    D = d // H
    seq = [Shard(0), Shard(1)]          # sequence parallel
    whole = [Shard(0), Replicate()]     # entering a tensor-parallel region

    def into_tp(x):
        return x.redistribute(placements=whole) if parallel else x

    def out_of_tp(x, bias):
        return (x.redistribute(placements=seq) if parallel else x) + bias

    ids, targets = tokens[:, :S], tokens[:, 1:].reshape(B * S)
    x = F.embedding(ids, params["wte"])
    if parallel:
        x = x.redistribute(placements=seq)
    x = F.dropout(x + params["wpe"], cfg.dropout)
    for b in params["blocks"]:
        h = into_tp(F.layer_norm(x, (d,), b["ln1_w"], b["ln1_b"]))
        q, k, v = ((h @ b[w]).view(B, S, H, D).transpose(1, 2) for w in ("wq", "wk", "wv"))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        o = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
        o = o.transpose(1, 2).reshape(B, S, d)
        x = x + F.dropout(out_of_tp(o @ b["wo"], b["bo"]), cfg.dropout)
        h = into_tp(F.layer_norm(x, (d,), b["ln2_w"], b["ln2_b"]))
        u = F.gelu(h @ b["w1"] + b["b1"], approximate="tanh")
        x = x + F.dropout(out_of_tp(u @ b["w2"], b["b2"]), cfg.dropout)
    h = into_tp(F.layer_norm(x, (d,), params["lnf_w"], params["lnf_b"]))
    logits = (h @ params["head"]).reshape(B * S, cfg.vocab)
    return logits, targets


def step(cfg, params, opt, tokens, mask, parallel):
    logits, targets = forward(cfg, params, tokens, mask, parallel)
    if parallel:
        # loss_parallel's mean needs a one-dimensional mesh: the sum over the rows, then / rows.
        with loss_parallel():
            loss = F.cross_entropy(logits, targets, reduction="sum") / (cfg.batch * cfg.seq)
            loss.backward()
    else:
        loss = F.cross_entropy(logits, targets)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(flat(params), 1.0)
    opt.step()
    opt.zero_grad()


def time_steps(fn, runs=3):
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def measure(cfg):
    """single_ms and local_tensor_ms of one training step of the model `cfg` describes."""
    out = {"config": vars(cfg)}
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=gen)
    mask = torch.triu(torch.ones(cfg.seq, cfg.seq, dtype=torch.bool), diagonal=1)

    params = build_params(cfg, None, gen)
    opt = torch.optim.AdamW(flat(params), lr=3e-3, weight_decay=0.1, foreach=False)
    out["single_ms"] = time_steps(lambda: step(cfg, params, opt, tokens, mask, False))
    try:
        mesh = init_device_mesh("cpu", (2, RANKS // 2), mesh_dim_names=("dp", "tp"))
        with LocalTensorMode(RANKS):
            params = build_params(cfg, mesh, gen)
            opt = torch.optim.AdamW(flat(params), lr=3e-3, weight_decay=0.1, foreach=False)
            d_tokens = distribute_tensor(tokens, mesh, [Shard(0), Replicate()])
            d_mask = distribute_tensor(mask, mesh, [Replicate(), Replicate()])
            out["local_tensor_ms"] = time_steps(
                lambda: step(cfg, params, opt, d_tokens, d_mask, True))
    except Exception as e:  # a release without a strategy for some op: say which
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", dest="d_model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--dropout", type=float, default=0.1)
    cfg = parser.parse_args()
    # gpt_bench's BM_gpt_step_toy: the example's own shape.
    toy = argparse.Namespace(**{**vars(cfg), "d_model": 64, "heads": 4, "seq": 32})

    torch.autograd._enable_record_function(False)
    out = {"peer": "pytorch", "version": torch.__version__, "threads": torch.get_num_threads()}
    dist.init_process_group("fake", rank=0, world_size=RANKS)
    out["gpt"] = measure(cfg)
    out["gpt_toy"] = measure(toy)
    dist.destroy_process_group()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
