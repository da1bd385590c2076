"""A Kubernetes API client of Python's standard library alone, for the outside harness.

Written apart from netcm's Rust client and the Rust bench on purpose: the outside harness shares no code
with what it measures. One keep-alive HTTPS connection per thread; writes retried on 429, 5xx and dropped
connections, as a careful client would.
"""

import http.client
import json
import re
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass


class ApiError(Exception):
    """An API request that failed for good: its method, path, status and the server's message."""


@dataclass(frozen=True)
class Endpoint:
    """Where the API server is and the files that authenticate to it."""

    host: str
    port: int
    ca_file: str
    cert_file: str
    key_file: str

    def ssl_context(self):
        """A TLS context trusting the cluster's CA and presenting the client certificate."""
        ctx = ssl.create_default_context(cafile=self.ca_file)
        ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


def parse_kubeconfig(text):
    """The endpoint of a kubeconfig that names its certificate files (as hack/controlplane.sh writes)."""
    fields = {}
    for key in ("server", "certificate-authority", "client-certificate", "client-key"):
        match = re.search(rf"^\s*{key}:\s*(\S+)\s*$", text, re.M)
        if not match:
            raise ValueError(f"the kubeconfig has no `{key}:` naming a value (inline *-data is not read)")
        fields[key] = match.group(1)
    server = urllib.parse.urlsplit(fields["server"])
    if server.scheme != "https" or not server.hostname:
        raise ValueError(f"the kubeconfig's server is not an https URL: {fields['server']}")
    return Endpoint(
        host=server.hostname,
        port=server.port or 443,
        ca_file=fields["certificate-authority"],
        cert_file=fields["client-certificate"],
        key_file=fields["client-key"],
    )


RETRIED_STATUSES = {429, 500, 502, 503, 504}


class Client:
    """JSON requests over one keep-alive connection per thread."""

    def __init__(self, endpoint, attempts=8, timeout=120):
        self.endpoint = endpoint
        self.attempts = attempts
        self.timeout = timeout
        self._ctx = endpoint.ssl_context()
        self._local = threading.local()

    def _connection(self):
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(
                self.endpoint.host, self.endpoint.port, context=self._ctx, timeout=self.timeout
            )
            self._local.conn = conn
        return conn

    def _drop_connection(self):
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
        self._local.conn = None

    def request(self, method, path, body=None, content_type="application/json", ok=(200, 201)):
        """Sends one request (retried); returns (status, decoded body). A status in `ok` or 404/409 is
        returned, any other raises ApiError after the last attempt."""
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        last = None
        for attempt in range(self.attempts):
            try:
                conn = self._connection()
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException) as err:
                self._drop_connection()
                last = f"connection: {err}"
            else:
                if resp.status in ok or resp.status in (404, 409):
                    return resp.status, json.loads(raw) if raw else None
                last = f"{resp.status}: {raw[:300].decode(errors='replace')}"
                if resp.status not in RETRIED_STATUSES:
                    break
            time.sleep(min(0.1 * 2**attempt, 5.0))
        raise ApiError(f"{method} {path}: {last}")

    def list_all(self, path, page=5000):
        """Every item of a collection, page by page; returns (items, resourceVersion of the list)."""
        items, cont, version = [], "", ""
        sep = "&" if "?" in path else "?"
        while True:
            query = f"limit={page}" + (f"&continue={urllib.parse.quote(cont)}" if cont else "")
            _, body = self.request("GET", f"{path}{sep}{query}")
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            version = version or meta.get("resourceVersion", "")
            cont = meta.get("continue") or ""
            if not cont:
                return items, version

    def watch(self, path):
        """The events of a watch request, one decoded JSON object each, until the server ends it."""
        conn = http.client.HTTPSConnection(
            self.endpoint.host, self.endpoint.port, context=self._ctx, timeout=None
        )
        try:
            conn.request("GET", path, headers={"Accept": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise ApiError(f"watch {path}: {resp.status}: {resp.read()[:300].decode(errors='replace')}")
            while True:
                line = resp.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()
