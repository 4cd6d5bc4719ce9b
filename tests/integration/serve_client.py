"""What the server tests share: credentials, a chat template for the tiny tokenizer, one plain HTTP call."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

KEY, ADMIN, MODEL = "sk-test", "admin-test", "tiny"
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}={% endif %}"


def http_json(method: str, url: str, token: str, body: bytes | None = None) -> tuple[int, Any]:
    """(status, parsed JSON body) of one plain HTTP call with a bearer token."""
    request = urllib.request.Request(url, data=body, method=method, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
