"""Any web page can send requests to a loopback server: a "simple" cross-site POST (Content-Type text/plain, no
preflight) runs the model, and a page whose DNS name is rebound to 127.0.0.1 reads the answers. So, before any
route runs (RequestGuard), a request is refused when:
- its Host is not allowed (403 host_not_allowed). Allowed: localhost, a loopback address (127.0.0.0/8, [::1]),
  the address the server is bound to, and the names listed in ApiConfig.allowed_hosts (--allow-host), with or
  without a port. Bound to every interface (0.0.0.0 or ::, which needs an API key), any IP-address Host is
  allowed too, since clients on the network name the machine by its LAN address; a DNS name must still be listed,
  as a rebound name is exactly what a hostile page sends. A request without Host (HTTP/1.0) passes: browsers
  always send one;
- it carries an Origin (every browser request that a page makes across origins does) that is not among
  ApiConfig.cors_origins, unless those hold '*' (403 origin_not_allowed); clients that send no Origin (curl,
  editors, SDKs) are unaffected;
- it is a POST (every POST here takes a JSON body) whose Content-Type is not application/json, parameters such
  as charset aside (415 unsupported_media_type): a page can send application/json across origins only after a
  CORS preflight, which only the origins allowed above pass.
"""

from __future__ import annotations

import ipaddress
import time

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from .api_config import ApiConfig, RequestRecord, keep_record
from .api_schema import ApiError


class RequestGuard:
    """Refuses a request a web page could have sent (see the module's docstring) before any route reads a byte
    of its body or the model does any work; each refusal is recorded, so the Server panel lists it."""

    def __init__(self, app: ASGIApp, config: ApiConfig):
        self.app, self.config = app, config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = request_refusal(Headers(scope=scope), scope["method"], self.config)
            if refused is not None:
                client = scope.get("client")
                keep_record(
                    self.config,
                    RequestRecord("-", scope["path"], client[0] if client else "?", time.time(), status=refused.status),
                )
                response = JSONResponse(
                    refused.body(), status_code=refused.status, headers={"Connection": "close"}
                )  # its body, if any, is never read
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def request_refusal(headers: Headers, method: str, config: ApiConfig) -> ApiError | None:
    """Why this request is refused (Host, then Origin, then Content-Type), or None."""
    host = headers.get("host")
    if host is not None and not host_allowed(host, config):
        return ApiError(
            403,
            f"Host {host!r} is not allowed: this server answers to {_answers_to(config)}. If it "
            "is this server's name, list it: --allow-host NAME, or Host names in SpecChat's Server "
            "panel (a web page can point any name at this machine).",
            kind="permission_error",
            code="host_not_allowed",
        )
    origin = headers.get("origin")
    if origin is not None and "*" not in config.cors_origins and origin not in config.cors_origins:
        return ApiError(
            403,
            f"Origin {origin!r} is not allowed: web pages may call this server only from the "
            "origins given with --cors ORIGIN (the Server panel's CORS origins).",
            kind="permission_error",
            code="origin_not_allowed",
        )
    media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
    if method == "POST" and media_type != "application/json":
        said = repr(media_type) if media_type else "missing"
        return ApiError(
            415, f"Content-Type {said}: this endpoint takes only 'application/json'.", code="unsupported_media_type"
        )
    return None


def host_allowed(host: str, config: ApiConfig) -> bool:
    name, bound = host_name(host), host_name(config.bind_host)
    if is_loopback(name) or name == bound or name in map(host_name, config.allowed_hosts):
        return True
    return _every_interface(bound) and _address(name) is not None  # an IP address; a DNS name must be listed


def _answers_to(config: ApiConfig) -> str:
    """The Hosts host_allowed takes, for a person (the listed names aside)."""
    bound = host_name(config.bind_host)
    if _every_interface(bound):
        return "localhost and IP addresses"
    if is_loopback(bound):
        return "localhost and loopback addresses"
    return f"localhost, loopback addresses and {bound}"


def is_loopback(host: str) -> bool:
    """localhost, or a loopback address (127.0.0.0/8, ::1)."""
    address = _address(host)
    return host == "localhost" or address is not None and address.is_loopback


def _every_interface(bound: str) -> bool:
    return bound in ("0.0.0.0", "::")


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def host_name(host: str) -> str:
    """'Example.COM.:8765' -> 'example.com', '[::1]:80' -> '::1': the name or address a Host header gives."""
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host.removesuffix(".")
