"""Where a remote engine is: a base URL, checked, and what a person should know about it before sending it text."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import InvalidSettingError


@dataclass(frozen=True)
class Endpoint:
    url: str  # the server's base, without /v1 (normalised_url)
    model: str = ""  # one of its /v1/models ids; "" = the first it lists
    api_key: str | None = None

    @property
    def host(self) -> str:
        """host[:port], never a user or password (normalised_url refuses them; older versions kept them)."""
        return urlsplit(self.url).netloc.rpartition("@")[2]


# A user and password before a host, in a URL ("http://me:pw@host") or in a label an older version made from one
# ("model @ me:pw@host"): normalised_url refuses them now; without_credentials takes them out of older text.
_CREDENTIALS = re.compile(r"(?<=://)[^\s/?#]*@|(?<![^\s(\[\"'])[^\s/?#@:()\[\]\"']+:[^\s/?#]*@")
CREDENTIALS_REFUSED = (
    "A remote engine's URL cannot hold a user name or password (user:password@…): SpecChat "
    "would have to keep it in plain text. Put the password or token in the API key field, "
    "which is kept in the system keyring."
)


def without_credentials(text: str) -> str:
    """text with any user:password@ before a host taken out."""
    return _CREDENTIALS.sub("", text)


def normalised_url(text: str) -> str:
    """The base URL of an OpenAI-compatible server as a person may type it ("localhost:8000", ".../v1/"), or
    InvalidSettingError saying what is wrong."""
    url = (text or "").strip()
    if not url:
        raise InvalidSettingError("A remote engine needs its URL, e.g. http://127.0.0.1:8000.")
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise InvalidSettingError(f"A remote engine's URL starts with http:// or https://, not {parts.scheme}://.")
    if "@" in parts.netloc:  # before any message that quotes the URL: it must not echo a password
        raise InvalidSettingError(CREDENTIALS_REFUSED)
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise InvalidSettingError(f"“{text.strip()}” has a port that is not a number.") from None
    if not parts.hostname:
        raise InvalidSettingError(f"“{text.strip()}” names no server.")
    if parts.query or parts.fragment:
        raise InvalidSettingError("A remote engine's URL is the server's address, without ?… or #….")
    path = parts.path.rstrip("/")
    path = path[:-3] if path.endswith("/v1") else path
    return f"{parts.scheme}://{parts.netloc}{path}"


def is_loopback_host(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain") or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def url_warning(url: str) -> str:
    """What to tell a person about sending conversations to url; "" when nothing. https is verified by httpx."""
    parts = urlsplit(url)
    if parts.scheme == "http" and not is_loopback_host(parts.hostname or ""):
        return (
            f"{parts.hostname} is reached over plain http: your messages and API key cross the network "
            "unencrypted. Use https, or a server on this machine."
        )
    return ""
