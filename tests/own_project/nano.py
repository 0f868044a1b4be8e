"""nanoGPT's GPT behind the contract (nanogpt_style.py stands for nanoGPT's model.py: `from model import ...`)."""

from nanogpt_style import GPT, GPTConfig


class NanoGPT(GPT):
    """The model file's keyword sizes in, every position's logits out; no init here: GPT's __init__ does it."""

    def __init__(self, vocab_size: int, max_seq_len: int, **config):
        super().__init__(GPTConfig(vocab_size=vocab_size, block_size=max_seq_len, **config))

    def forward(self, idx):
        return super().forward(idx, targets=idx)[0]  # given targets, GPT returns every position's logits
