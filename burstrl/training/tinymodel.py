"""The embedded default policy: a character-level tokenizer and a small Llama built from scratch.

Everything here runs offline. The tokenizer is a `tokenizers` WordLevel model over single characters, saved
as a standard `tokenizer.json` so that vLLM, TRL and transformers all load it like any Hub tokenizer.
"""

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>"]
ALPHABET = "0123456789+-*=? "
# With tools: letters for tool names and error messages, and the marks of the chat format below.
CHAT_ALPHABET = "abcdefghijklmnopqrstuvwxyz[]{}(),:|\"_.'"
# `<bos>12+34+56=|[add{a:12,b:34}]<eos>(46)|...|102<eos>`: the user's text, then `|` before every assistant turn,
# tool calls as `[name{key:json,...}]`, each turn closed by EOS, tool results in parentheses.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role == 'user' %}{{ m.content }}"
    "{% elif m.role == 'assistant' %}|{{ m.content }}"
    "{% for c in m.tool_calls | default([]) %}[{{ c.function.name }}{{ '{' }}"
    "{% for k, v in c.function.arguments.items() %}{{ k }}:{{ v | tojson }}{% if not loop.last %},{% endif %}"
    "{% endfor %}{{ '}' }}]{% endfor %}{{ eos_token }}"
    "{% elif m.role == 'tool' %}({{ m.content }}){% endif %}{% endfor %}"
    "{% if add_generation_prompt %}|{% endif %}"
)
# transformers' response template for that format: what `parse_response` turns a sampled turn into.
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "|",
    "fields": {
        "tool_calls": {"open_pattern": r"\[(?P<name>\w+)", "close_pattern": r"\]", "repeats": True, "content": "json",
                       "content_args": {"unquoted_keys": True},
                       "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}}},
        "content": {"close_pattern": r"<eos>|$", "content": "text"},
    },
}


def build_tokenizer(chat: bool = False) -> PreTrainedTokenizerFast:
    """The character tokenizer; `chat` adds the characters and the chat and response templates of tool use."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + list(ALPHABET + (CHAT_ALPHABET if chat else "")))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="?"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    # Fuse: decode joins characters with no separator (WordLevel's default would insert spaces).
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="?"
    )
    if chat:
        tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.response_template = RESPONSE_TEMPLATE
    return tokenizer


def build_model(tokenizer: PreTrainedTokenizerFast, hidden_size: int, layers: int, max_len: int) -> LlamaForCausalLM:
    # head_dim 64: vLLM's CPU attention rejects smaller head sizes.
    heads = max(1, hidden_size // 64)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=hidden_size // heads,
        max_position_embeddings=max_len,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def save_policy(model, tokenizer, out_dir: Path) -> None:
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
