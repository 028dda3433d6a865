"""Screenshots of the built site in a real browser, at the widths readers have.

Builds the site (``mkdocs build --strict``), serves it on 127.0.0.1, and has
headless Chromium (Debian's ``chromium`` package: ``apt-get install chromium``)
take a screenshot of each page at each width into ``screenshots/`` (ignored by git),
named ``PAGE-WIDTH.png``::

    python docs/screenshots.py [--out DIR] [--site SITE_DIR] [--width 1280 1920] [--height 2000]

``--site`` skips the build and serves an already built site.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = {"home": "", "getting-started": "getting-started/", "guide": "guides/compiled/",
         "api": "reference/api/", "performance": "performance/"}
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("no Chromium found: apt-get install -y chromium")


def build(site: Path) -> None:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                   cwd=ROOT, env=env, check=True)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def serve(site: Path) -> http.server.ThreadingHTTPServer:
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def shoot(browser: str, url: str, png: Path, width: int, height: int) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}",
                        f"--window-size={width},{height}", f"--screenshot={png}", url],
                       check=True, capture_output=True, timeout=120)
    if not png.is_file() or png.stat().st_size == 0:
        raise RuntimeError(f"Chromium wrote no screenshot of {url}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "screenshots")
    parser.add_argument("--site", type=Path, help="an already built site to serve")
    parser.add_argument("--width", type=int, nargs="+", default=[1280, 1920])
    parser.add_argument("--height", type=int, default=2000)
    args = parser.parse_args()
    browser = chromium()
    with tempfile.TemporaryDirectory() as tmp:
        site = args.site or Path(tmp) / "site"
        if args.site is None:
            build(site)
        server = serve(site)
        args.out.mkdir(parents=True, exist_ok=True)
        try:
            for name, path in PAGES.items():
                url = f"http://127.0.0.1:{server.server_port}/{path}"
                for width in args.width:
                    png = args.out / f"{name}-{width}.png"
                    shoot(browser, url, png, width, args.height)
                    print(f"{url} -> {png}")
        finally:
            server.shutdown()


if __name__ == "__main__":
    main()
