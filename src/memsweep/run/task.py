"""task: classification | causal_lm | image_classification — the head put on the model, what a batch carries,
and the quality metric.

classification: a sequence classifier, macro F1 and accuracy; causal_lm: a causal LM on the text, eval loss and
perplexity (also before training); image_classification: an image classifier on `pixel_values`, accuracy and
macro F1. Each task in full: docs/guide/running.md.
"""
import math

from ..config.schema import TaskConf, TaskName


def head_refusal(name, model_type: str, is_decoder: bool = False) -> str | None:
    """Why a model of this transformers type cannot take the task's head (None when it can), from
    transformers' own tables of which architecture has which head. A causal LM needs a decoder: an
    encoder with a masked-LM head (BERT) reads the whole text at once, and its causal-LM class only
    warns unless its config says it is a decoder."""
    from transformers.models.auto import modeling_auto as auto

    if TaskName(name) == TaskName.causal_lm:
        if model_type not in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            return f"transformers has no causal-LM head for {model_type!r} models"
        if model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES and not is_decoder:
            return f"{model_type!r} is an encoder (a masked-LM model), not a decoder that predicts the next token"
        return None
    if TaskName(name) == TaskName.image_classification:
        if model_type not in auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES:
            return f"transformers has no image-classification head for {model_type!r} models"
        return None
    if model_type not in auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES:
        return f"transformers has no sequence-classification head for {model_type!r} models"
    return None


def auto_class(cfg: TaskConf):
    import transformers

    return getattr(transformers, {TaskName.causal_lm: "AutoModelForCausalLM",
                                  TaskName.image_classification: "AutoModelForImageClassification"}.get(
        cfg.name, "AutoModelForSequenceClassification"))


def images(cfg: TaskConf) -> bool:
    """Whether a batch carries images (`pixel_values`) rather than tokens."""
    return cfg.name == TaskName.image_classification


def labelled(cfg: TaskConf) -> bool:
    """Whether the task reads the label column."""
    return cfg.name in (TaskName.classification, TaskName.image_classification)


def num_labels(cfg: TaskConf, labels) -> int:
    """Outputs of the classification head: the labels found in the data (a real job) or listed in
    `data.labels` (an estimate, which reads no data); without them a binary task. A causal LM has no
    such head (its config keeps the default)."""
    return max(2, len(labels)) if labels and labelled(cfg) else 2


def collator(cfg: TaskConf, tokenizer, pad_to_multiple_of):
    from transformers import DataCollatorForLanguageModeling, DataCollatorWithPadding, DefaultDataCollator

    if images(cfg):  # every image has the model's size: stacked as they are
        return DefaultDataCollator()
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
