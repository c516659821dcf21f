"""Goose as a Hugging Face ``custom_generate`` folder, the door that also carries ``streamer=`` and ``tokenizer=``.

``model.generate(..., custom_generate=goose.hf.FOLDER, trust_remote_code=True)`` loads this file and
calls its ``generate`` with every argument ``generate`` was given. See ``goose.hf.generate_from_folder``.
"""

from goose.hf import generate_from_folder as generate

__all__ = ["generate"]
