"""multihost: run one distributed training job across several machines over SSH."""

__version__ = "0.1.0"
