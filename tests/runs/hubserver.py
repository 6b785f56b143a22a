"""A loopback stand-in for the Hugging Face Hub's upload API (what ``HfApi.create_repo`` and
``HfApi.upload_folder`` call), recording every commit; ``fail_commits`` makes the first N commits
answer 400."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeHub:
    def __init__(self, fail_commits: int = 0):
        self.repos: dict[str, dict] = {}  # repo id -> {"private": bool}
        self.commits: list[dict] = []  # {"repo", "message", "files": {path: bytes}}
        self.requests: list[str] = []
        self.fail_commits = fail_commits
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _body(self) -> bytes:
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _json(self, code: int, obj) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = self._body()
                hub.requests.append(f"POST {self.path}")
                base = f"http://127.0.0.1:{hub.port}"
                if self.path == "/api/repos/create":
                    req = json.loads(body)
                    repo = f"{req.get('organization') or 'me'}/{req['name']}"
                    hub.repos.setdefault(repo, {"private": req.get("private", req.get("visibility") == "private")})
                    return self._json(200, {"url": f"{base}/{repo}", "name": repo})
                parts = self.path.split("/")  # /api/models/OWNER/NAME/{preupload|commit}/REV
                if len(parts) >= 7 and parts[1:3] == ["api", "models"] and parts[5] == "preupload":
                    files = json.loads(body)["files"]
                    return self._json(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                      for f in files], "commitOid": "0" * 40})
                if len(parts) >= 7 and parts[1:3] == ["api", "models"] and parts[5] == "commit":
                    if hub.fail_commits > 0:
                        hub.fail_commits -= 1
                        return self._json(400, {"error": "injected failure"})  # 5xx would be retried inside huggingface_hub
                    lines = [json.loads(x) for x in body.decode().splitlines() if x.strip()]
                    header = next(x["value"] for x in lines if x["key"] == "header")
                    files = {x["value"]["path"]: base64.b64decode(x["value"]["content"]) for x in lines if x["key"] == "file"}
                    hub.commits.append({"repo": f"{parts[3]}/{parts[4]}", "message": header["summary"], "files": files})
                    return self._json(200, {"commitUrl": f"{base}/{parts[3]}/{parts[4]}/commit/{'a' * 40}",
                                            "commitOid": "a" * 40, "pullRequestUrl": None})
                return self._json(404, {"error": f"unknown {self.path}"})

            def do_GET(self):
                hub.requests.append(f"GET {self.path}")
                return self._json(404, {"error": f"unknown {self.path}"})

            do_HEAD = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
