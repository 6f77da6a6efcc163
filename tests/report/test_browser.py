"""The report in a real browser: headless Chromium loads a test-only copy of index.html with a tiny
inline script that, on `load`, counts the images that decoded (`complete && naturalWidth > 0`);
`--dump-dom` returns the page with that count. A copy with one broken image must count it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = next((p for p in (shutil.which("chromium-headless-shell"), shutil.which("chromium"),
                               shutil.which("chromium-browser"), "/usr/bin/chromium")
                 if p and Path(p).is_file()), None)
CHECK = """<script>window.addEventListener("load", function () {
  var images = document.images, ok = 0;
  for (var i = 0; i < images.length; i++) { if (images[i].complete && images[i].naturalWidth > 0) ok++; }
  var marker = document.createElement("div");
  marker.id = "image-check"; marker.textContent = "IMAGES " + ok + "/" + images.length;
  document.body.appendChild(marker);
});</script>"""
BROKEN = '<img src="data:image/png;base64,AAAAAAAA" alt="broken on purpose">'


def _loaded(page: Path) -> tuple[int, int]:
    """(images decoded, images) as Chromium saw them."""
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=3000",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r"IMAGES (\d+)/(\d+)", out.stdout)
    assert found, f"no image check in Chromium's DOM (rc {out.returncode}): {out.stderr[-2000:]}"
    return int(found[1]), int(found[2])


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium: `make browser` installs chromium-headless-shell")
def test_chromium_loads_every_image(report, tmp_path):
    html = report.path.read_text()
    plots = sum(len(s.figures) for s in report.sections)
    checked = tmp_path / "checked.html"
    checked.write_text(html.replace("</body>", CHECK + "</body>"))
    assert _loaded(checked) == (plots, plots) and plots >= 10
    broken = tmp_path / "broken.html"  # the check itself sees a bad image
    broken.write_text(html.replace("</body>", BROKEN + CHECK + "</body>"))
    assert _loaded(broken) == (plots, plots + 1)
