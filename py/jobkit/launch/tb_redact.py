"""Keeps secret-looking MaxText config keys out of TensorBoard (audit row S2).

MaxText copies `HF_TOKEN` from the environment into its config as `hf_access_token`, and its metric logger
writes every config key as a TensorBoard text summary (`<key>/text_summary`). The event file lives in the job
dir and TensorBoard serves it to anyone who can reach its port. MaxText's own `KEYS_NO_LOGGING` covers only
the log. `install()` wraps MaxText's one text sink, `max_utils.add_text_to_summary_writer`, in the launcher
process before training starts, so that a secret key (see `is_secret_key`), or a text holding the value of a
token from the environment, is never written.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping

# A key is secret when one of its words (split on anything not a letter or digit) is one of these...
SECRET_WORDS = frozenset(
    {"secret", "secrets", "password", "passwd", "passphrase", "credential", "credentials", "apikey"}
)
# ...or when it ends in `token` (hf_access_token; not num_moe_token_chunks or tokenizer_path)...
SECRET_LAST_WORDS = frozenset({"token"})
# ...or ends in `<one of these>_key` (wandb_api_key, aws_secret_access_key, private_key; not key_proj,
# gdn_key_head_dim or num_kv_heads).
KEY_QUALIFIERS = frozenset({"api", "access", "secret", "private", "auth", "signing", "encryption"})
# Environment variables whose values are dropped wherever they show up in a text summary.
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
_WORD = re.compile(r"[^a-z0-9]+")


def is_secret_key(key: str) -> bool:
    """True when a config key names a credential (the rule is in SECRET_WORDS and its neighbours)."""
    words = [w for w in _WORD.split(key.lower()) if w]
    if not words:
        return False
    if SECRET_WORDS.intersection(words) or words[-1] in SECRET_LAST_WORDS:
        return True
    return len(words) > 1 and words[-1] == "key" and words[-2] in KEY_QUALIFIERS


def _secret_values(env: Mapping[str, str]) -> tuple[str, ...]:
    # Short values would match ordinary text; real tokens are far longer.
    return tuple(v for v in (env.get(name, "") for name in SECRET_ENV) if len(v) >= 8)


def redacting(original: Callable, env: Mapping[str, str] | None = None) -> Callable:
    """A stand-in for add_text_to_summary_writer(key, value, writer) that drops secret keys and values."""
    values = _secret_values(os.environ if env is None else env)

    @functools.wraps(original)
    def add_text_to_summary_writer(key, value, summary_writer):
        text = str(value)
        if is_secret_key(str(key)) or any(v in text for v in values):
            return None
        return original(key, value, summary_writer)

    add_text_to_summary_writer.jobkit_redacting = True
    return add_text_to_summary_writer


def _max_utils_modules(modules: Mapping[str, object]) -> Iterable[object]:
    # maxtext >= 0.2: maxtext.utils.max_utils; source-tree images: MaxText.max_utils or a top-level max_utils.
    for name, module in list(modules.items()):
        if module is not None and (name == "max_utils" or name.endswith(".max_utils")):
            yield module


def install(modules: Mapping[str, object] | None = None) -> int:
    """Wrap add_text_to_summary_writer in every loaded MaxText max_utils module; returns how many were
    wrapped (0: MaxText's text sink is not loaded, nothing done)."""
    count = 0
    for module in _max_utils_modules(sys.modules if modules is None else modules):
        original = getattr(module, "add_text_to_summary_writer", None)
        if not callable(original):
            continue
        if not getattr(original, "jobkit_redacting", False):
            module.add_text_to_summary_writer = redacting(original)
        count += 1
    return count
