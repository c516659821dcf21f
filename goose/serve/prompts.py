"""Request prompts to token ids: chat messages through the model's chat template, completions as raw text.

The encoder holds its own copy of the tokenizer: the worker thread decodes with the original while
requests are encoded here, in the server's thread pool, and a fast tokenizer is one Rust object
that must not be used from two threads at once.
"""

from __future__ import annotations

import copy
import threading

from jinja2.exceptions import TemplateError
from transformers import PreTrainedTokenizerBase

from goose.models import encode_chat, encode_prompt, has_chat_template
from goose.serve.errors import bad_request
from goose.serve.schemas import ChatMessage

# A text longer than context x this many characters is first counted on a prefix of that length:
# tokenizing a 4 MB prompt only to refuse it took ~35 MB of the tokenizer's per-token strings and
# offsets per request, which the allocator kept (RSS +418 MB after a dozen). No tokenizer's tokens
# average 16 characters on real text; a text where they do is tokenized whole, as before.
PREFIX_CHARS_PER_TOKEN = 16
CUT_MARGIN_TOKENS = 8  # a text cut mid-word may tokenize into a few tokens more or fewer at the cut


class PromptEncoder:
    """Encodes prompts and checks them, and the tokens asked for, against the model's context."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, context: int) -> None:
        self._tokenizer = copy.deepcopy(tokenizer)
        self._lock = threading.Lock()
        self.vocab_size = vocab_size
        self.context = context
        self.chat_template = has_chat_template(tokenizer)

    def chat(self, messages: list[ChatMessage]) -> list[int]:
        """Ids of the conversation followed by the assistant's generation prompt.

        One user message is encoded exactly as ``goose generate PROMPT`` encodes PROMPT.
        """
        if not self.chat_template:
            raise bad_request("this model has no chat template: send raw text to /v1/completions",
                              param="messages", code="no_chat_template")
        self._refuse_if_surely_too_long([m.text for m in messages], "messages")
        if len(messages) == 1 and messages[0].role == "user":
            with self._lock:
                return self._fits(encode_prompt(self._tokenizer, messages[0].text, chat=True), "messages")
        # "developer" is OpenAI's newer name for the system role; chat templates know "system"
        conversation = [{"role": "system" if m.role == "developer" else m.role, "content": m.text} for m in messages]
        try:
            with self._lock:
                ids = encode_chat(self._tokenizer, conversation)
        except TemplateError as error:  # e.g. a template that insists on alternating user/assistant turns
            raise bad_request(f"the model's chat template rejects these messages: {error}", param="messages") from None
        return self._fits(ids, "messages")

    def completion(self, prompt: str | list[str] | list[int]) -> list[int]:
        """Ids of a raw-text prompt (the tokenizer's own special tokens, no chat template) or the ids given."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            ids = self._fits(list(prompt), "prompt")
            if max(ids) >= self.vocab_size:
                raise bad_request(f"prompt: token ids must be below the vocabulary size {self.vocab_size}",
                                  param="prompt")
            return ids
        text = prompt if isinstance(prompt, str) else prompt[0]
        if not text:
            raise bad_request("prompt: give some text to continue", param="prompt")
        self._refuse_if_surely_too_long([text], "prompt")
        with self._lock:
            return self._fits(encode_prompt(self._tokenizer, text, chat=False), "prompt")

    def prediction(self, text: str, prompt_ids: list[int]) -> list[int]:
        """Ids of a Predicted Outputs text (no special tokens), checked to fit the context after the prompt."""
        self._refuse_if_surely_too_long([text], "prediction")
        with self._lock:
            ids = self._tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise bad_request("prediction: the predicted text encodes to no tokens", param="prediction")
        if len(prompt_ids) + len(ids) >= self.context:
            raise bad_request(f"prediction: a prediction of {len(ids)} tokens after a prompt of {len(prompt_ids)} "
                              f"does not fit the model's context of {self.context} tokens", param="prediction",
                              code="context_length_exceeded")
        return ids

    def token_limit(self, prompt_ids: list[int], max_tokens: int | None, param: str = "max_tokens") -> int:
        """``max_tokens``, checked to fit after the prompt; by default all the context left."""
        room = self.context - len(prompt_ids)
        if max_tokens is None:
            return room
        if max_tokens > room:
            raise bad_request(
                f"{param}: {max_tokens} tokens after a prompt of {len(prompt_ids)} exceed the model's context of "
                f"{self.context} tokens (at most {room} fit)", param=param, code="context_length_exceeded")
        return max_tokens

    def _refuse_if_surely_too_long(self, texts: list[str], param: str) -> None:
        """A 400 for texts whose prefixes alone already hold more tokens than the context, before encoding all."""
        budget = self.context * PREFIX_CHARS_PER_TOKEN
        if sum(len(text) for text in texts) <= budget:
            return
        counted = 0
        with self._lock:
            for text in texts:
                prefix = text[:budget]
                counted += len(self._tokenizer.encode(prefix, add_special_tokens=False)) - CUT_MARGIN_TOKENS
                budget -= len(prefix)
                if budget <= 0:
                    break
        if counted >= self.context:
            raise bad_request(f"{param}: the prompt has at least {counted} tokens; the model's context is "
                              f"{self.context} tokens", param=param, code="context_length_exceeded")

    def _fits(self, ids: list[int], param: str) -> list[int]:
        if not ids:
            raise bad_request(f"{param}: the prompt encodes to no tokens", param=param)
        if len(ids) >= self.context:
            raise bad_request(f"{param}: a prompt of {len(ids)} tokens does not fit the model's context of "
                              f"{self.context} tokens", param=param, code="context_length_exceeded")
        return ids
