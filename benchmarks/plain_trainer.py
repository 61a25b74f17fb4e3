"""Baseline: stock transformers Trainer, no subclass, the same training as memsweep's default.

adamw_torch_fused (Trainer's default), lr 1e-4, weight decay 0, linear schedule, clipping 1.0, batch 32, one process
on the CPU, `bf16=True` for bf16 (autocast); batches padded to the longest by DataCollatorWithPadding in
Trainer's seeded random order; it counts non-padding tokens (as memsweep does). Step ends are recorded by a
callback, as in memsweep.
"""
import tempfile
import time

import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from plain_common import parse_args, read_data, write_result


class StepEnds(TrainerCallback):
    def __init__(self):
        self.ends, self.first_step_unix = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.first_step_unix is None:
            self.first_step_unix = time.time()

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())


def main() -> None:
    import datasets

    args = parse_args(__doc__)
    if args.threads:
        torch.set_num_threads(args.threads)
    texts, labels = read_data(args.data)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    encoded = tokenizer(texts, truncation=True, max_length=args.max_seq_len)
    columns = {k: encoded[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in encoded}
    train = datasets.Dataset.from_dict({**columns, "labels": labels})
    model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=max(labels) + 1)
    timer = StepEnds()
    with tempfile.TemporaryDirectory() as out_dir:
        training_args = TrainingArguments(
            output_dir=out_dir, report_to="none", save_strategy="no", eval_strategy="no", logging_steps=10,
            max_steps=args.steps, per_device_train_batch_size=args.batch_size, learning_rate=args.lr,
            weight_decay=0.0, max_grad_norm=1.0, lr_scheduler_type="linear", optim="adamw_torch_fused",
            seed=args.seed, data_seed=args.seed, use_cpu=True, bf16=args.dtype == "bf16",
            include_num_input_tokens_seen="non_padding")  # memsweep counts them too
        trainer = Trainer(model=model, args=training_args, train_dataset=train, processing_class=tokenizer,
                          data_collator=DataCollatorWithPadding(tokenizer), callbacks=[timer])
        out = trainer.train()
    write_result(args, "plain_trainer", timer.ends, timer.first_step_unix, trainer.state.num_input_tokens_seen,
                 torch.get_num_threads(), out.training_loss)


if __name__ == "__main__":
    main()
