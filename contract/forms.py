"""The exact forms both sides check: a commit, an image ID, a digest-pinned reference, a
container name, and the shapes of secrets (their names and their values).

Patterns are used with `fullmatch` only (`re.match(r"^...$")` also accepts a trailing newline),
except the secret shapes, which are searched for inside a value.
"""
from __future__ import annotations

import re
from typing import Final

# a commit is the manifest's form (contract/manifest.py is also sent to the nodes as text, so it
# stays self-contained: this module takes the form from it, not the other way round)
from contract.manifest import COMMIT as COMMIT

IMAGE_ID: Final = re.compile(r"sha256:[0-9a-f]{64}")
DIGEST_REF: Final = re.compile(r"(?P<repo>[^@\s]+)@(?P<digest>sha256:[0-9a-f]{64})")
CONTAINER_ID: Final = re.compile(r"[0-9a-f]{12,64}")
# Docker's rule for a container name ([a-zA-Z0-9][a-zA-Z0-9_.-]+), bounded: a name the stack
# puts into a shell, accepts in config or reads back from a host
CONTAINER_NAME: Final = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}")

# --------------------------------------------------------------------------- secret shapes
# One definition for the program (config refuses a plain value of these shapes and redacts
# them from errors) and the pack (hf-token-secret and vllm-api-key flag them where secrets must
# never sit). Where the two differed, the broader shape was kept, so nothing either caught
# before gets through now: a Hugging Face token is `hf_` + 20 or more alphanumerics (the
# program asked for 30), found anywhere in a value (the pack asked for word boundaries); an
# OpenAI-style key `sk-` + 16 or more, anywhere; a PEM private key by its header.
HF_TOKEN: Final = re.compile(r"hf_[A-Za-z0-9]{20,}")
API_KEY: Final = re.compile(r"sk-[A-Za-z0-9_-]{16,}")
PEM_KEY: Final = re.compile(r"-----BEGIN [A-Z ]*KEY")
SECRET_VALUE: Final = re.compile("|".join(f"(?:{p.pattern})" for p in (HF_TOKEN, API_KEY,
                                                                        PEM_KEY)))
# A name that says it holds a secret (HF_TOKEN, VLLM_API_KEY, DB_PASSWORD...). Every TOKEN
# counts, TOKENIZERS_PARALLELISM and MAX_TOKENS included (the program refused those in plain
# environment maps; the pack used to skip them): a flag value (0/1/true/false) never counts as
# a secret in the pack, and a plain environment map has no need for such names.
SECRET_NAME: Final = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|API_?KEY|PRIVATE_?KEY"
                                r"|CREDENTIAL", re.IGNORECASE)
API_KEY_NAME: Final = re.compile(r"API_?KEY", re.IGNORECASE)
# The environment names of the two secrets the stack holds (spark-vllm:hfToken, vllmApiKey)
HF_TOKEN_ENV_NAMES: Final = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN")
API_KEY_ENV_NAMES: Final = ("VLLM_API_KEY",)


def secret_env_name(name: str) -> bool:
    """An environment variable whose name says it holds a secret (HF_TOKEN, VLLM_API_KEY...)."""
    return SECRET_NAME.search(name) is not None


def secret_value(value: str) -> bool:
    """A value shaped like a known token (Hugging Face, OpenAI-style keys, PEM keys)."""
    return SECRET_VALUE.search(value) is not None
