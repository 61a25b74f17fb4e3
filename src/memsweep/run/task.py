"""task: classification | causal_lm — the head put on the model, what a batch carries, and the quality metric.

- classification: `AutoModelForSequenceClassification` on the label column; quality = macro F1 (and
  accuracy) of the eval split's predictions. On a decoder the head reads the last non-pad token.
- causal_lm: `AutoModelForCausalLM`, next-token loss on every token of the text column (padding
  masked with -100 by the collator); quality = eval loss and its perplexity, exp(eval loss). Trainer's
  eval loss is the mean over eval batches of each batch's mean token loss. The same split is evaluated
  before training too (`perplexity_before`): a pretrained decoder already has a perplexity, and what
  fine-tuning did is the difference (a classifier's new head has no F1 worth measuring before).
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


def collator(cfg: TaskConf, tokenizer, pad_to_multiple_of):
    from transformers import DataCollatorForLanguageModeling, DataCollatorWithPadding

    if cfg.name == TaskName.causal_lm:
        return DataCollatorForLanguageModeling(tokenizer, mlm=False, pad_to_multiple_of=pad_to_multiple_of)
    return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else float("inf")


def evaluates_before(cfg: TaskConf) -> bool:
    """Whether the eval split is also evaluated before training (Trainer's eval_on_start)."""
    return cfg.name == TaskName.causal_lm


def before_metrics(eval_loss: float) -> dict[str, float]:
    return {"eval_loss_before": eval_loss, "perplexity_before": perplexity(eval_loss)}


def evaluate(cfg: TaskConf, trainer, eval_data) -> dict[str, float]:
    """The task's quality metrics on the eval split."""
    if cfg.name == TaskName.causal_lm:
        # Loss only: predictions would be batch x tokens x vocabulary logits for the whole split.
        loss = float(trainer.evaluate(eval_data)["eval_loss"])
        return {"eval_loss": loss, "perplexity": perplexity(loss)}
    import numpy as np
    from sklearn.metrics import accuracy_score, f1_score

    prediction = trainer.predict(eval_data)
    predicted = np.argmax(prediction.predictions, axis=-1)
    labels = prediction.label_ids
    return {"f1": float(f1_score(labels, predicted, average="macro")),
            "accuracy": float(accuracy_score(labels, predicted)),
            "eval_loss": float(prediction.metrics.get("test_loss", float("nan")))}
