"""A character-level tokenizer built locally with `tokenizers`, saved in Hugging Face format.

Vocabulary: the special tokens, newline, and the 95 printable ASCII characters (100 ids in all). Any
other character maps to <unk>, so real benchmark text still tokenizes. Nothing is downloaded.
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
SPECIAL_TOKENS = [PAD, EOS, BOS, UNK]
CHARACTERS = ["\n"] + [chr(c) for c in range(32, 127)]
assert all(ch in string.printable for ch in CHARACTERS)


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Every character is its own token (spaces and newlines included).
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, bos_token=BOS, unk_token=UNK,
        clean_up_tokenization_spaces=False, padding_side="left",
    )
    # Saved in tokenizer_config.json: `auto` prompting (literl eval, training) then uses the raw problem text,
    # the only format the testbed model was warmed up on.
    tok.init_kwargs["literl_prompt_template"] = "raw"
    return tok
