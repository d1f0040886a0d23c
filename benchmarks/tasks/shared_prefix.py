"""A long system prompt that many requests share (instructions plus a tool list, about 500
tokens), for the prefix-reuse benchmarks (``benchmarks/prefix_reuse.py``, ``benchmarks/serve.py``).

Requests to a deployed model often start the same way: a system prompt with the rules of the
task, the tools the model may call, a few examples. Only the last user message differs.
"""

from __future__ import annotations

import json
from typing import Any

from benchmarks.tasks.suite import EXTRACTION_TASKS

__all__ = ["SYSTEM_PROMPT", "TOOLS", "shared_messages"]

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "lookup_customer", "description": "Find a customer record by name or e-mail address.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "a name or an e-mail address"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 20}}, "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "create_ticket", "description": "Open a support ticket for a customer.",
        "parameters": {"type": "object", "properties": {
            "customer_id": {"type": "string"},
            "priority": {"type": "string", "enum": ["low", "normal", "high", "urgent"]},
            "summary": {"type": "string", "maxLength": 120},
            "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["customer_id", "priority", "summary"]}}},
    {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert an amount between two ISO 4217 currencies.",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number"}, "from": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "to": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["amount", "from", "to"]}}},
]

SYSTEM_PROMPT = (
    "You are the data desk assistant of a mid-sized logistics company. You read short texts "
    "written by colleagues and customers (e-mails, chat messages, notes from phone calls, order "
    "confirmations) and turn the facts in them into JSON records that other programs read.\n\n"
    "Rules:\n"
    "1. Copy names, places, numbers and dates exactly as the text writes them; never guess a "
    "value the text does not state. When a field is optional and the text says nothing about "
    "it, leave the field out.\n"
    "2. Numbers are JSON numbers, without units or thousands separators: 1,200 kg becomes 1200.\n"
    "3. Booleans are true or false, never strings. Lists keep the order of the text.\n"
    "4. Keep each string short: the shortest span of the text that states the fact.\n"
    "5. Answer with the JSON object only: no prose before or after it, no Markdown fences.\n"
    "6. When the text mentions several candidates for a field, take the one the text confirms "
    "last: a correction overrides the first statement, and a later message overrides an "
    "earlier one.\n\n"
    "These tools exist in the company's systems; other steps of the pipeline call them with the "
    "records you produce, so use their field names where a field means the same thing:\n"
    + "\n".join(json.dumps(t["function"], separators=(",", ":")) for t in TOOLS)
    + "\n\nThe user message gives the fields to extract, their JSON Schema, and the text."
)


def shared_messages(task: dict[str, Any]) -> list[dict[str, str]]:
    """Chat messages for an extraction task (``tasks.suite.EXTRACTION_TASKS``)
    after the shared system prompt: the field names and the text (the schema itself goes in
    the request's ``response_format``, where the constraint enforces it)."""
    keys = ", ".join(task["schema"]["properties"])
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"Extract these fields: {keys}.\n\nText: {task['text']}\n\nJSON:"},
    ]


TASKS = EXTRACTION_TASKS
