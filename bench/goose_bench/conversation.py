"""A sample's turns -> the prompt token ids of each turn, the way MT-Bench and Spec-Bench run them.

Turn k's prompt holds every earlier user turn with the model's own answer to it, then user turn
k. With a chat template the conversation is rendered by the template (the answers as assistant
messages); without one (base models) the parts are joined by blank lines. Each method builds its
second turn from *its own* first answer: a lossless method's answer equals AR's, so its second
prompt does too, and a method that drifted is not silently handed AR's text.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from goose.models import encode_chat, encode_prompt, has_chat_template

PLAIN_SEPARATOR = "\n\n"


def turn_prompt_ids(
    tokenizer: PreTrainedTokenizerBase, turns: Sequence[str], answers: Sequence[str], *, chat: bool = True
) -> list[int]:
    """Prompt ids for user turn ``len(answers)``: ``turns[: len(answers) + 1]`` with ``answers`` between."""
    if len(answers) >= len(turns):
        raise ValueError(f"{len(answers)} answers leave no user turn among {len(turns)}")
    if not answers:  # the first turn is exactly what `goose generate` would encode
        return encode_prompt(tokenizer, turns[0], chat=chat)
    if chat and has_chat_template(tokenizer):
        messages = []
        for turn, answer in zip(turns, answers, strict=False):
            messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": turns[len(answers)]})
        return encode_chat(tokenizer, messages)
    parts: list[str] = []
    for turn, answer in zip(turns, answers, strict=False):
        parts += [turn, answer]
    parts.append(turns[len(answers)])
    return encode_prompt(tokenizer, PLAIN_SEPARATOR.join(parts), chat=False)
