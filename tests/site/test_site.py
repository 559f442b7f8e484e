"""The docs site as people read it: the built site (``make docs`` into ``site/``) served on
127.0.0.1 and opened in headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
driven by Selenium through the system chromedriver). A reader searches for
``send_message_in_transaction``, follows a result and lands on that API entry.

Screenshots of the home page, a guide and the API entry go to ``RMQ_SITE_SCREENSHOTS`` (a
directory), else to the test's tmp dir. No chromium: the test skips with one reason, or fails
when ``RMQ_REQUIRE`` names ``chromium`` (CI). Run by ``make test-docs-site`` (marker
``docs_site``, left out of ``make test``, which builds no site).
"""

from __future__ import annotations

import functools
import os
import shutil
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.require import missing

pytestmark = pytest.mark.docs_site

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("RMQ_SITE_DIR", ROOT / "site"))
QUERY = "send_message_in_transaction"
ENTRY = "rmq_semantics.TransactionProducer.send_message_in_transaction"
GUIDE = "guides/transactions/"
# Chromium's start, the search worker's index and a page load are each well under this.
WAIT_S = 30
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per asset would bury the test's own output


@pytest.fixture(scope="module")
def site_url() -> Iterator[str]:
    if not (SITE / "index.html").is_file():
        pytest.fail(f"no built site in {SITE}: run `make docs` first", pytrace=False)
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="site-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=WAIT_S)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        missing(
            "chromium",
            "no chromium/chromedriver on PATH (make docs-browser-setup installs Debian's)",
        )
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium: the docs extra")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--window-size=1280,900",
        "--disable-dev-shm-usage",  # a container's /dev/shm is often too small
        "--disable-gpu",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(arg)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # Chromium refuses to run as root with it
    # The system chromedriver, named explicitly: Selenium Manager downloads nothing.
    service = webdriver.ChromeService(executable_path=chromedriver)
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    configured = os.environ.get("RMQ_SITE_SCREENSHOTS")
    out = Path(configured) if configured else tmp_path_factory.mktemp("screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _screenshot(driver: Any, path: Path) -> None:
    assert driver.save_screenshot(str(path))
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_a_reader_searches_and_lands_on_the_api_entry(
    browser: Any, site_url: str, screenshots: Path
):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser
    wait = WebDriverWait(driver, WAIT_S)

    driver.get(site_url)
    wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, "article h1")))
    assert driver.title.endswith("rmq-semantics")
    _screenshot(driver, screenshots / "home.png")

    driver.get(site_url + GUIDE)
    heading = wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, "article h1")))
    assert "Transactional messages" in heading.text
    _screenshot(driver, screenshots / "guide.png")

    # Material's search: the header's box; its worker loads the index, then lists results.
    box = wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, "input.md-search__input")))
    box.click()
    box.send_keys(QUERY)
    # The list is re-rendered as the search worker answers each keystroke: a result found
    # a moment ago can be gone (stale) by the click, so find and click it as one step.
    chosen = WebDriverWait(
        driver, WAIT_S, ignored_exceptions=(StaleElementReferenceException,)
    ).until(functools.partial(_click_result, f'.md-search-result__list a[href$="#{ENTRY}"]'))
    assert QUERY in chosen

    # Material adds ?h=<query> (the highlight) before the entry's anchor.
    wait.until(ec.url_contains(f"#{ENTRY}"))
    assert "/reference/api/" in driver.current_url
    entry = wait.until(ec.visibility_of_element_located((By.ID, ENTRY)))
    assert entry.text.startswith(QUERY)
    signature = entry.find_element(By.XPATH, "following-sibling::*[1]")
    assert signature.text.startswith(f"{QUERY}(msg")
    assert _in_view(driver, entry) and _in_view(driver, signature)
    # The docstring reads as prose: its Sphinx roles became inline code.
    description = signature.find_element(By.XPATH, "following-sibling::*[1]")
    assert "SystemTopicError" in description.text and ":class:" not in description.text
    _screenshot(driver, screenshots / "api-entry.png")


def _click_result(selector: str, driver: Any) -> str | None:
    """Click the first search result matching ``selector``; its text, or None while there is
    none yet."""
    from selenium.webdriver.common.by import By

    results = driver.find_elements(By.CSS_SELECTOR, selector)
    if not results:
        return None
    text = str(results[0].text)
    results[0].click()
    return text


def _in_view(driver: Any, element: Any) -> bool:
    """Inside the viewport and not under Material's sticky header."""
    return bool(
        driver.execute_script(
            "const r = arguments[0].getBoundingClientRect();"
            "const header = document.querySelector('.md-header');"
            "const top = header ? header.getBoundingClientRect().bottom : 0;"
            "return r.top >= top - 1 && r.bottom <= window.innerHeight;",
            element,
        )
    )
