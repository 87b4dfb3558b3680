"""Two tiny `transformers` models made here, from nothing downloaded: a causal language model and a
text classifier, each saved as `save_pretrained` saves it (config, safetensors weights, tokenizer).

Their tokenizer is a byte-level BPE trained by `tokenizers` on a few local sentences; their weights
are random (seeded) or, for the classifier, fitted for a few steps on a toy sentiment set, so that
its labels mean something. They are small enough to load in a second and to generate on a CPU, which
is all the tests, the example endpoint and the generation benchmark need of them.

    python examples/train_transformers.py OUT_DIR   ->  OUT_DIR/tiny-lm, OUT_DIR/tiny-classifier
"""

from __future__ import annotations

import sys
from pathlib import Path

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a model serves tokens one by one to every caller",
    "hello world from a tiny language model",
    "good great wonderful happy excellent fine",
    "bad awful terrible sad poor horrible",
    "user: hello\nassistant: hi, how can I help?",
]
POSITIVE = ["good movie", "great day", "wonderful and happy", "excellent work", "fine and good"]
NEGATIVE = ["bad movie", "awful day", "terrible and sad", "poor work", "horrible and bad"]
# A chat template in the Jinja dialect tokenizers use: role-tagged turns, then the assistant's cue.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def tokenizer():  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(CORPUS * 8, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def train(out: Path) -> dict[str, Path]:
    """Both models under `out`; returns their folders by name."""
    import torch
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        LlamaConfig,
        LlamaForCausalLM,
    )

    torch.manual_seed(0)
    tok = tokenizer()
    lm_dir, classifier_dir = out / "tiny-lm", out / "tiny-classifier"
    lm = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=512,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    )
    lm.generation_config.do_sample = False
    lm.save_pretrained(lm_dir)
    tok.save_pretrained(lm_dir)

    classifier = BertForSequenceClassification(
        BertConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=128,
            pad_token_id=tok.pad_token_id,
            num_labels=2,
            id2label={0: "NEGATIVE", 1: "POSITIVE"},
            label2id={"NEGATIVE": 0, "POSITIVE": 1},
        )
    )
    texts = POSITIVE + NEGATIVE
    labels = torch.tensor([1] * len(POSITIVE) + [0] * len(NEGATIVE))
    batch = tok(texts, padding=True, return_tensors="pt")
    optimizer = torch.optim.AdamW(classifier.parameters(), lr=5e-3)
    classifier.train()
    for _ in range(30):
        optimizer.zero_grad()
        classifier(**batch, labels=labels).loss.backward()
        optimizer.step()
    classifier.eval()
    classifier.save_pretrained(classifier_dir)
    tok.save_pretrained(classifier_dir)
    return {"tiny-lm": lm_dir, "tiny-classifier": classifier_dir}


if __name__ == "__main__":
    made = train(Path(sys.argv[1] if len(sys.argv) > 1 else "model-store"))
    for name, folder in made.items():
        print(f"{name}: {folder}")
