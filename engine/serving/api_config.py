"""What a running API is configured with (ApiConfig), and the record of each request it served or refused
(RequestRecord), kept for the Server panel. openai_api.py serves with them; request_guard.py refuses with them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .in_flight import InFlight

MAX_BODY_BYTES = 8 << 20  # a 128k-token conversation is ~0.5-1.5 MB of JSON; 20 MB took 72 s to refuse before
MAX_RECORDS = 1000  # requests kept in ApiConfig.records, newest last


@dataclass
class RequestRecord:
    """One served request, for a log: what the Server panel lists."""

    id: str
    endpoint: str
    client: str
    started: float  # time.time()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens_per_s: float | None = None  # the response's timings.predicted_per_second (llama.cpp's count)
    acceptance_rate: float | None = None
    ttft_s: float | None = None
    method: str = "-"  # "-" for a request refused before it reached the engine
    finish: str | None = None
    status: int = 200


@dataclass
class ApiConfig:
    model_id: str
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    on_record: Callable[[RequestRecord], None] | None = None  # called on the event loop's thread
    records: list[RequestRecord] = field(default_factory=list)
    max_body_bytes: int = MAX_BODY_BYTES
    bind_host: str = "127.0.0.1"  # the address listened on: a Host that names it is allowed
    allowed_hosts: tuple[str, ...] = ()  # more names a Host may give (--allow-host)
    in_flight: InFlight = field(default_factory=InFlight)  # tokenizing off the event loop: stop waits for it


def keep_record(config: ApiConfig, rec: RequestRecord) -> None:
    config.records.append(rec)
    del config.records[:-MAX_RECORDS]
    if config.on_record:
        config.on_record(rec)
