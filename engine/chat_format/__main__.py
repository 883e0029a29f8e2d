"""What a model will read for a conversation, for debugging a chat template:

    python -m engine.chat_format --model PATH|embedded --messages FILE.json

FILE.json holds a list of {"role": "system"|"user"|"assistant", "content": "..."}. Prints JSON: the
prompt `text`, `uses_template`, the `stop` strings and the `tokens`, one per line as
{"id", "piece", "special"} (special: a control token, shown by its text). Bad input: one line on
stderr and exit code 2. So is a chat template that breaks a limit (time, memory, output: see
engine/template_sandbox.py); the line says what SpecChat's chat uses for that model instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import safe_files
from ..errors import EngineError
from . import ChatFormatter, check_messages, is_special

EXIT_BAD_INPUT = 2
MAX_MESSAGES_BYTES = 64 << 20  # beyond any context a model here takes
_MESSAGES = safe_files.Wording(unreadable="Cannot read {label}: {why}.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engine.chat_format", description="Print the prompt a model reads for a conversation."
    )
    parser.add_argument("--model", required=True, help="a GGUF file, or 'embedded'")
    parser.add_argument("--messages", required=True, help='a JSON file: a list of {"role", "content"}')
    args = parser.parse_args(argv)
    try:
        messages = read_messages(Path(args.messages))
        with load_vocab(args.model) as model:
            print(dumps(describe(model, messages)))
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


def load_vocab(spec: str):
    """The model's vocabulary and template only (no weights). The one place the CLI loads a file."""
    from ..decoding.runtime import LoadSettings, Model
    from ..modelfiles.embedded import resolve_model

    return Model(resolve_model(spec), LoadSettings(n_gpu_layers=0), vocab_only=True)


def read_messages(path: Path) -> list[dict]:
    try:  # only a regular file, and not past the limit (engine.safe_files): a FIFO or /dev/zero is refused
        messages = json.loads(safe_files.read_text(path, MAX_MESSAGES_BYTES, _MESSAGES))
    except safe_files.FileRefused as exc:
        raise EngineError(str(exc)) from exc
    except ValueError as exc:  # bad JSON, or bytes that are not UTF-8
        raise EngineError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(messages, list):
        raise EngineError(f'{path} must hold a JSON list of {{"role", "content"}} messages.')
    check_messages(messages)  # before the model loads: a mistake here is said at once
    return messages


def describe(model, messages: list[dict]) -> dict:
    formatter = ChatFormatter(model)
    text, tokens, stop = formatter.render(messages)
    if formatter.template and formatter.template_error:  # refused, now or by the model check: this tool's job
        raise EngineError(formatter.template_error)
    return {
        "model": str(model.path),
        "uses_template": formatter.uses_template,
        "template_error": formatter.template_error,
        "stop": list(stop),
        "text": text,
        "n_tokens": len(tokens),
        "tokens": [_token(model, t) for t in tokens],
    }


def _token(model, token: int) -> dict:
    special = is_special(model, token)
    raw = model.token_text(token) if special else model.piece(token)  # a control token's piece is empty
    return {"id": token, "piece": raw.decode("utf-8", "replace"), "special": special}


def dumps(report: dict) -> str:
    """JSON with one token per line: readable for a person, parseable for a test."""
    head = {k: v for k, v in report.items() if k != "tokens"}
    rows = ",\n".join("    " + json.dumps(t, ensure_ascii=False) for t in report["tokens"])
    return json.dumps(head, indent=2, ensure_ascii=False)[:-2] + f',\n  "tokens": [\n{rows}\n  ]\n}}'


if __name__ == "__main__":
    sys.exit(main())
