"""jobkit dashboard, and the headless-Chromium harness (browser.py) its page is checked with."""

import pytest
from browser import BrowserError, artifact_path, load, open_tab

# ---------------------------------------------------------------------------------------------------------
# The harness itself: it must catch a broken page, or a clean result from it means nothing.


def test_browser_reports_uncaught_errors_console_errors_and_network(tmp_path, request):
    page_file = tmp_path / "bad.html"
    page_file.write_text(
        "<html><body><p id=p>bad</p>"
        '<script>throw new Error("boom")</script>'
        '<script>console.error("oops")</script>'
        '<img src="https://cdn.example.com/x.png">'
        '<script>setTimeout(() => { throw new Error("late boom") }, 10)</script>'
        "</body></html>"
    )
    page = load(page_file, artifact_path(request))
    assert any("Error: boom" in e for e in page.errors), page.errors
    assert any("late boom" in e for e in page.errors), page.errors
    assert any("console.error: oops" in e for e in page.errors), page.errors
    # Only loopback is reachable: the CDN image is asked for and fails.
    assert "https://cdn.example.com/x.png" in page.requests
    assert any("cdn.example.com" in e for e in page.errors), page.errors
    assert page.screenshot.stat().st_size > 1000 and page.screenshot.read_bytes()[:4] == b"\x89PNG"


def test_browser_dom_after_scripts_and_driving(tmp_path, request):
    page_file = tmp_path / "ok.html"
    page_file.write_text(
        "<html><body><input id=f><table id=t><tr><th>n</th></tr>"
        '<tr data-k="a"><td>alpha</td><td>1</td></tr><tr data-k="b"><td>beta</td><td>2</td></tr></table>'
        "<button id=b>add</button><script>"
        "document.getElementById('b').onclick = () => document.body.insertAdjacentHTML('beforeend', '<p class=added>x</p>');"
        "document.getElementById('f').oninput = e => document.querySelectorAll('tr[data-k]').forEach("
        "  r => r.style.display = r.textContent.includes(e.target.value) ? '' : 'none');"
        "console.log('ready');</script></body></html>"
    )
    page = load(page_file)
    assert page.errors == [] and "log: ready" in page.console
    assert page.rows("t") == [["alpha", "1"], ["beta", "2"]]
    assert page.count("tr", data_k=None) == 2 and page.count("tr", data_k="b") == 1
    with open_tab(page_file) as tab:
        tab.click("#b")
        tab.click("#b")
        tab.type("#f", "bet")
        assert [r["data-k"] for r in tab.visible("tr[data-k]")] == ["b"]
        page = tab.snapshot(artifact_path(request))
        with pytest.raises(BrowserError, match="no element"):
            tab.click("#missing")
    assert page.count("p", "added") == 2 and page.errors == []
    assert artifact_path(request).exists()
