"""The POST of a job's `notify.webhook`, run inside user_actions as the job's owner.

Why as the owner and in a child: the URL is the user's, and the daemon is root. A child that has
become the owner reaches only what the owner could reach (a host firewall's owner match sees the
user, not root), and as_user kills it with its session at the deadline, whatever the server does
(a slow drip of bytes keeps each socket read under its own timeout, not the whole call). No redirect
is followed (a 3xx is a failure: a redirect could name a scheme or host the spec's check refused),
no proxy from an environment is used (the child's environment is as_user's fixed one), and at most
MAX_REPLY_BYTES of the answer are read. stdlib only.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401  the resolver encodes host names with it, lazily: load it while root
import urllib.error
import urllib.request
from typing import Any

MAX_REPLY_BYTES = 4096
USER_AGENT = "spx-trainer-notify"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises the 3xx as an HTTPError


def post(args: dict[str, Any]) -> dict[str, Any]:
    """POST `args["body"]` (a JSON text) to `args["url"]` within `args["timeout"]` s per socket
    operation; {"status": HTTP status} for a 2xx, else raises with what the server said."""
    url = str(args["url"])
    if not url.startswith(("http://", "https://")):  # the spec checked it; a second look costs nothing
        raise ValueError("only http:// and https:// URLs")
    request = urllib.request.Request(url, data=str(args["body"]).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": USER_AGENT})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())
    try:
        with opener.open(request, timeout=float(args["timeout"])) as reply:
            status = int(reply.status)
            reply.read(MAX_REPLY_BYTES)
    except urllib.error.HTTPError as e:
        text = e.read(200).decode("utf-8", "replace").strip() if e.fp is not None else ""
        raise RuntimeError(f"HTTP {e.code} {e.reason}" + (f": {text}" if text else "")) from None
    if not 200 <= status < 300:
        raise RuntimeError(f"HTTP {status}")
    return {"status": status}
