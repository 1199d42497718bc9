"""Masking of secret-looking values before anything is recorded (operations, logs, lineage)."""

from __future__ import annotations

import re

SECRET_NAME = re.compile(r"(SECRET|TOKEN|PASSW|PASSPHRASE|API_?KEY|PRIVATE|CREDENTIAL|AUTH|_KEY$|^KEY$)",
                         re.IGNORECASE)
MASK = "***"


def mask_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (MASK if SECRET_NAME.search(k) and v else v) for k, v in env.items()}


def secret_values(env: dict[str, str]) -> list[str]:
    return sorted((v for k, v in env.items() if SECRET_NAME.search(k) and len(v) >= 4), key=len, reverse=True)


def mask_text(text: str, secrets: list[str]) -> str:
    for s in secrets:
        text = text.replace(s, MASK)
    return text
