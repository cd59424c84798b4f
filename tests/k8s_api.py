"""A local HTTP endpoint that answers the real kubernetes client as an API server does, from recorded answers.

No Kubernetes API server can run here, so the launcher's calls go to this one: it answers each (method, path) a test
names with a recorded JSON file from tests/fixtures/k8s-api/ (README there: where each answer and message comes
from), keeps what the client applies (server-side apply creates the object and gives it a uid, as the API server
does), answers what it does not know with the API server's 404 Status, and records every request (method, path,
query, content type, body) for the test to read.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "k8s-api"
CREATED = "2026-07-20T10:00:02Z"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    body: object = None


def recorded(name: str) -> dict | str:
    """A recorded answer: JSON, or a container's log as text (a .log file)."""
    text = (FIXTURES / name).read_text()
    return text if name.endswith(".log") else json.loads(text)


def resource_of(path: str) -> tuple[str, str, str]:
    """(resource, group, name) of /api/v1/namespaces/NS/RESOURCE/NAME or /apis/GROUP/VERSION/namespaces/..."""
    parts = path.strip("/").split("/")
    group = parts[1] if parts[0] == "apis" else ""
    rest = parts[parts.index("namespaces") + 2:] if "namespaces" in parts else parts[2:]
    return rest[0] if rest else "", group, rest[1] if len(rest) > 1 else ""


def not_found(path: str) -> dict:
    """The API server's 404 for a missing object (apimachinery errors.NewNotFound)."""
    resource, group, name = resource_of(path)
    qualified = f"{resource}.{group}" if group else resource
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": f'{qualified} "{name}" not found', "reason": "NotFound",
            "details": {"name": name, **({"group": group} if group else {}), "kind": resource}, "code": 404}


def deleted(path: str, obj: dict) -> dict:
    """The API server's answer to a DELETE that went through: a Status of Success, except for a claim, whose
    answer is the claim itself, marked for deletion and kept by its pvc-protection finalizer while a pod uses it."""
    resource, group, name = resource_of(path)
    if resource == "persistentvolumeclaims":
        return {"kind": "PersistentVolumeClaim", "apiVersion": "v1", **obj,
                "metadata": {**obj["metadata"], "deletionTimestamp": CREATED, "deletionGracePeriodSeconds": 0}}
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {"name": name, **({"group": group} if group else {}), "kind": resource,
                        "uid": obj["metadata"]["uid"]}}


@dataclass
class ApiServer:
    """answers: (METHOD, path) -> a fixture file name, or (status code, file name or dict). Use as a context
    manager; `.client()` is a kubernetes ApiClient pointed at it."""

    answers: dict = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    objects: dict[str, dict] = field(default_factory=dict)  # path -> what was applied there

    def __enter__(self) -> "ApiServer":
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def client(self):
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        return client.ApiClient(configuration)

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig whose cluster is this server (for the CLI, as a user's KUBECONFIG)."""
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: recorded\n  cluster: {{server: \"{self.url}\"}}\n"
            "users:\n- name: me\n  user: {token: not-a-secret}\n"
            "contexts:\n- name: recorded\n  context: {cluster: recorded, user: me}\n"
            "current-context: recorded\n"
        )
        return path

    def calls(self, method: str | None = None) -> list[tuple[str, str]]:
        """(method, path) of each request, in order (of one method when given)."""
        return [(r.method, r.path) for r in self.requests if method in (None, r.method)]

    # --- answering ---------------------------------------------------------------------------------------------

    def answer(self, request: Request) -> tuple[int, dict]:
        key = (request.method, request.path)
        if key in self.answers:
            code, body = self._recorded(self.answers[key])
            return code, body if isinstance(body, str) else _selected(body, request.query.get("labelSelector"))
        if request.method == "PATCH":
            return 200, self._patch(request)
        if request.method == "GET" and request.path in self.objects:
            return 200, self.objects[request.path]
        if request.method == "DELETE" and (known := self._known(request.path)):
            self.objects.pop(request.path, None)
            return 200, deleted(request.path, known)
        return 404, not_found(request.path)

    def _known(self, path: str) -> dict | None:
        """The object at path: applied here, or an item of a list answer of its collection."""
        if path in self.objects:
            return self.objects[path]
        collection, name = path.rsplit("/", 1)
        answer = self.answers.get(("GET", collection))
        items = self._recorded(answer)[1].get("items", []) if answer else []
        return next((item for item in items if item["metadata"]["name"] == name), None)

    def _recorded(self, answer) -> tuple[int, dict]:
        code, body = answer if isinstance(answer, tuple) else (200, answer)
        return code, recorded(body) if isinstance(body, str) else body

    def _patch(self, request: Request) -> dict:
        """Server-side apply creates or updates the object (the server sets uid, resourceVersion, creation time);
        a merge patch merges into what is there."""
        current = self.objects.get(request.path)
        if request.content_type == "application/apply-patch+yaml" or current is None:
            obj = json.loads(json.dumps(request.body))
            server = {"uid": str(uuid.uuid5(uuid.NAMESPACE_URL, request.path)), "resourceVersion": "1",
                      "creationTimestamp": CREATED}
            obj["metadata"] = {**(current or {}).get("metadata", {}), **obj["metadata"], **server}
        else:
            obj = _merge(current, request.body)
        self.objects[request.path] = obj
        return obj


def _selected(body: dict, selector: str | None) -> dict:
    """A list answer filtered by a label selector of equality terms (key=value) and existence terms (key), as the
    API server filters it."""
    if not selector or "items" not in body:
        return body
    terms = [term.split("=", 1) if "=" in term else (term, None) for term in selector.split(",")]

    def matches(item: dict) -> bool:
        labels = item.get("metadata", {}).get("labels") or {}
        return all(key in labels and (value is None or labels[key] == value) for key, value in terms)

    return {**body, "items": [item for item in body["items"] if matches(item)]}


def _merge(target: dict, patch: dict) -> dict:
    """RFC 7386 JSON merge patch."""
    merged = dict(target)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _handler(api: ApiServer):
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            request = Request(self.command, url.path, dict(parse_qsl(url.query)), self.headers.get("Content-Type"),
                              json.loads(raw) if raw else None)
            api.requests.append(request)
            code, body = api.answer(request)
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = do_DELETE = do_POST = _serve  # noqa: N815 (http.server's naming)

        def log_message(self, *args) -> None:
            pass

    return Handler
