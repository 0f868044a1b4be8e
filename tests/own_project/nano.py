"""nanoGPT's GPT behind the contract: the adapter of docs/own-project.md, "A worked adapter: nanoGPT"."""

# nano.py, beside nanoGPT's model.py (tests/own_project: nanogpt_style.py stands for it, written in its style)
from nanogpt_style import GPT, GPTConfig  # with nanoGPT's own file: from model import GPT, GPTConfig


class NanoGPT(GPT):
    def __init__(self, vocab_size: int, max_seq_len: int, **config):
        super().__init__(GPTConfig(vocab_size=vocab_size, block_size=max_seq_len, **config))

    def forward(self, idx):
        return super().forward(idx, targets=idx)[0]  # given targets, GPT returns every position's logits
