"""Baseline: a minimal hand-written PyTorch fine-tuning loop.

tokenise (truncate to max_seq_len, no padding) -> shuffle with the seed -> per batch: pad to the
longest -> forward (bf16 autocast if asked) -> backward -> clip to norm 1.0 -> AdamW step ->
linear LR decay -> zero grads. The same training memsweep's default runs (fused AdamW, lr 1e-4,
weight decay 0, linear schedule, clipping 1.0), and the same batches as Trainer's seeded
RandomSampler (torch.randperm with a generator seeded by the seed).
"""
import time

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from plain_common import parse_args, read_data, write_result


def main() -> None:
    args = parse_args(__doc__)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    texts, labels = read_data(args.data)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    encoded = tokenizer(texts, truncation=True, max_length=args.max_seq_len)
    model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=max(labels) + 1)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, fused=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1 - s / args.steps))
    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(args.seed)).tolist()
    keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in encoded]

    step_ends, tokens_seen, first_step_unix, loss = [], 0, None, None
    for step in range(args.steps):
        if first_step_unix is None:
            first_step_unix = time.time()
        start = (step * args.batch_size) % len(order)
        idx = order[start:start + args.batch_size]
        batch = tokenizer.pad([{k: encoded[k][i] for k in keys} for i in idx], return_tensors="pt")
        batch["labels"] = torch.tensor([labels[i] for i in idx])
        tokens_seen += sum(len(encoded["input_ids"][i]) for i in idx)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        step_ends.append(time.perf_counter())
    write_result(args, "plain_loop", step_ends, first_step_unix, tokens_seen, torch.get_num_threads(), loss.item())


if __name__ == "__main__":
    main()
