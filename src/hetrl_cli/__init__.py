"""hetrl: plan and run RL post-training of LLMs on heterogeneous GPUs and networks."""

__version__ = "0.1.0"
