"""task: classification | causal_lm — the head put on the model, what a batch carries, and the quality metric.

- classification: `AutoModelForSequenceClassification` on the label column; quality = macro F1 (and
  accuracy) of the eval split's predictions. On a decoder the head reads the last non-pad token.
- causal_lm: `AutoModelForCausalLM`, next-token loss on every token of the text column (padding
  masked with -100 by the collator); quality = eval loss and its perplexity, exp(eval loss). Trainer's
  eval loss is the mean over eval batches of each batch's mean token loss.
"""
import math

from ..config.schema import TaskConf, TaskName

# The results.json metric that says how good a job is, and whether higher is better.
QUALITY = {TaskName.classification: ("f1", True), TaskName.causal_lm: ("perplexity", False)}


def auto_class(cfg: TaskConf):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    return AutoModelForCausalLM if cfg.name == TaskName.causal_lm else AutoModelForSequenceClassification


def peft_task_type(name) -> str:
    return "CAUSAL_LM" if TaskName(name) == TaskName.causal_lm else "SEQ_CLS"


def labelled(cfg: TaskConf) -> bool:
    """Whether the task reads the label column."""
    return cfg.name == TaskName.classification


def num_labels(cfg: TaskConf, labels) -> int:
    """Outputs of the classification head: the labels found in the data (a real job) or listed in
    `data.labels` (an estimate, which reads no data); without them a binary task. A causal LM has no
    such head (its config keeps the default)."""
    return max(2, len(labels)) if labels and labelled(cfg) else 2


def collator(cfg: TaskConf, tokenizer, pad_to_multiple_of):
    from transformers import DataCollatorForLanguageModeling, DataCollatorWithPadding

    if cfg.name == TaskName.causal_lm:
        return DataCollatorForLanguageModeling(tokenizer, mlm=False, pad_to_multiple_of=pad_to_multiple_of)
    return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)


def evaluate(cfg: TaskConf, trainer, eval_data) -> dict[str, float]:
    """The task's quality metrics on the eval split."""
    if cfg.name == TaskName.causal_lm:
        # Loss only: predictions would be batch x tokens x vocabulary logits for the whole split.
        loss = float(trainer.evaluate(eval_data)["eval_loss"])
        return {"eval_loss": loss, "perplexity": math.exp(loss) if loss < 700 else float("inf")}
    import numpy as np
    from sklearn.metrics import accuracy_score, f1_score

    prediction = trainer.predict(eval_data)
    predicted = np.argmax(prediction.predictions, axis=-1)
    labels = prediction.label_ids
    return {"f1": float(f1_score(labels, predicted, average="macro")),
            "accuracy": float(accuracy_score(labels, predicted)),
            "eval_loss": float(prediction.metrics.get("test_loss", float("nan")))}
