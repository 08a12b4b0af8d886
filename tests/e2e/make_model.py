"""Build the e2e suite's tiny Llama model and tokenizer locally (no downloads).

Run with the vLLM venv's Python (it has torch, transformers, tokenizers): ``python
tests/e2e/make_model.py OUT_DIR``. Recipe ("Real vLLM on this CPU machine"): a byte-level
BPE with a 2,048-token vocabulary trained with ``tokenizers`` on seeded generated text,
wrapped in ``PreTrainedTokenizerFast`` with a chat template that renders tools, tool calls
and tool results; a ``LlamaConfig`` with 2 layers, hidden size 128, 4 heads / 2 KV heads and
random weights (seed 0), saved with ``save_pretrained`` (~2 MB, ~10 s). Everything is
seeded, so two builds give the same token ids. A ``.recipe`` file marks a finished build: an
existing one with the same recipe version is kept as is.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

RECIPE = "tiny-llama-v2"
VOCAB = 2048
# Renders what real tool-calling templates render, so token parity means something: the
# tools (``tojson``), each assistant tool call's name and ``arguments | tojson`` (a JSON
# string left unparsed would render quoted), tool results with their call id, and one
# template variable of its own for ``chat_template_kwargs``. A chat without tools renders
# exactly as recipe v1 did.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|tools|>\n{% for tool in tools %}{{ tool | tojson }}\n"
    "{% endfor %}{{ eos_token }}\n{% endif %}"
    "{% if hint is defined %}<|hint|>\n{{ hint }}{{ eos_token }}\n{% endif %}"
    "{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['role'] == 'tool' %}<|result|>{{ message['tool_call_id'] }} {% endif %}"
    "{{ message['content'] }}"
    "{% if message['tool_calls'] %}{% for call in message['tool_calls'] %}\n<|call|>"
    "{{ call['function']['name'] }} {{ call['function']['arguments'] | tojson }}"
    "{% endfor %}{% endif %}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus(rng: random.Random, lines: int = 20_000) -> list[str]:
    """Pseudo-English: words from syllables, sentences with punctuation and digits."""
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "de", "pa", "qu", "zen",
                 "the", "and", "of", "in", "ing", "er", "on", "at", "st", "re", "an"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3)))
             for _ in range(3000)]
    out = []
    for _ in range(lines):
        n = rng.randint(4, 16)
        sent = " ".join(rng.choice(words) for _ in range(n))
        out.append(sent.capitalize() + rng.choice([".", "?", "!", ", 42.", ": 7;"]))
    return out


def build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(corpus(random.Random(0)), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=8192)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=256,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=8192, bos_token_id=tok.token_to_id("<s>"),
        eos_token_id=tok.token_to_id("</s>"), tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    (out / ".recipe").write_text(RECIPE)


def main() -> int:
    out = Path(sys.argv[1])
    marker = out / ".recipe"
    if marker.exists() and marker.read_text() == RECIPE:
        return 0
    build(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
