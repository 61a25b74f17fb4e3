"""memsweep: measure, side by side, what each memory and speed technique does to fine-tuning."""
__version__ = "0.1.0"
