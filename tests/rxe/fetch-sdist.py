#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Fetch one source distribution from the Python package index pip uses.

    fetch-sdist.py NAME FILENAME SHA256 OUT

The index is pip's own (PIP_INDEX_URL, else `pip config`'s
global.index-url, else pip's default), read as a PEP 503 simple index: no
host is named here. The file is written to OUT only if its SHA-256 is the
one given. Exit status 0 on success, 1 with a message otherwise.
"""
import hashlib
import html.parser
import os
import subprocess
import sys
import urllib.parse
import urllib.request


def index_url():
    url = os.environ.get("PIP_INDEX_URL")
    if url:
        return url
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "get",
                              "global.index-url"], capture_output=True,
                             text=True, timeout=60)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    from pip._internal.models.index import PyPI  # pip's default index
    return PyPI.simple_url


class Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.hrefs += [v for k, v in attrs if k == "href" and v]


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    name, filename, sha256, out = sys.argv[1:]
    page = index_url().rstrip("/") + "/" + name + "/"
    with urllib.request.urlopen(page, timeout=60) as r:
        parser = Links()
        parser.feed(r.read().decode("utf-8", "replace"))
    for href in parser.hrefs:
        url = urllib.parse.urljoin(page, href)
        if urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1] != filename:
            continue
        with urllib.request.urlopen(url.split("#")[0], timeout=300) as r:
            data = r.read()
        got = hashlib.sha256(data).hexdigest()
        if got != sha256:
            sys.exit("%s: sha256 %s, expected %s" % (filename, got, sha256))
        with open(out, "wb") as f:
            f.write(data)
        return
    sys.exit("%s: not in the package index's page %s" % (filename, page))


if __name__ == "__main__":
    main()
