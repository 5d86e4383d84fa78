"""`specdec serve`: the chat page at GET / (tools/serve/chat.html), driven by headless Chromium.

Needs Debian's chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver)."""

import os

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from conftest import CTX, start_server

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 60


def test_page_served(server):
    r = server.get("/")
    assert r.status_code == 200, r.status_code
    assert r.headers.get("Content-Type", "").startswith("text/html"), r.headers.get("Content-Type")
    for needle in ('id="input"', 'id="send"', 'id="log"', 'id="stats"'):
        assert needle in r.text, f"GET / lacks {needle}"


@pytest.fixture(scope="module")
def browser():
    for path in (CHROMIUM, CHROMEDRIVER):
        assert os.access(path, os.X_OK), f"{path} is missing: apt-get install chromium chromium-driver"
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def greedy_server():
    # The page sends no temperature, so the server's default applies: sampled at 1, an answer can
    # run on to the end of the context (one did, in CI), and then the next turn no longer fits.
    s = start_server("--temperature", "0")
    yield s
    s.stop()


def _stats(driver):
    return driver.find_element(By.ID, "stats").text


def _wait_done(driver, n_assistant):
    def ready(d):
        return "done" in _stats(d) and len(d.find_elements(By.CSS_SELECTOR, "#log .assistant")) >= n_assistant
    try:
        WebDriverWait(driver, WAIT_S).until(ready)
    except Exception:
        errors = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#log .error")]
        pytest.fail(f"#stats never said done within {WAIT_S} s: {_stats(driver)!r}; errors shown: {errors}; "
                    f"log: {driver.find_element(By.ID, 'log').text!r}")


def test_chat_page_conversation(greedy_server, browser):
    browser.get(greedy_server.url + "/")
    box = browser.find_element(By.ID, "input")
    box.send_keys("Say hello in one short sentence.")
    browser.find_element(By.ID, "send").click()
    _wait_done(browser, 1)
    users = browser.find_elements(By.CSS_SELECTOR, "#log .user")
    answers = browser.find_elements(By.CSS_SELECTOR, "#log .assistant")
    assert [u.text for u in users] == ["Say hello in one short sentence."], [u.text for u in users]
    assert len(answers) == 1 and answers[0].text.strip(), f"empty answer; stats {_stats(browser)!r}"
    stats = _stats(browser)
    assert "tokens/s" in stats and "acceptance" in stats, stats
    assert not browser.find_elements(By.CSS_SELECTOR, "#log .error")
    # A second turn, sent with Enter; Shift+Enter only adds a line.
    box.send_keys("And in French?")
    box.send_keys(Keys.SHIFT, Keys.ENTER)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#log .user")) == 1, "Shift+Enter sent the message"
    box.send_keys("Thanks.", Keys.ENTER)
    _wait_done(browser, 2)
    users = browser.find_elements(By.CSS_SELECTOR, "#log .user")
    assert len(users) == 2 and users[1].text == "And in French?\nThanks.", [u.text for u in users]
    answers = browser.find_elements(By.CSS_SELECTOR, "#log .assistant")
    assert len(answers) == 2 and answers[1].text.strip(), [a.text for a in answers]


def test_chat_page_shows_errors(server, browser):
    browser.get(server.url + "/")
    # A message longer than the context: the server's 400 message names the context length.
    browser.execute_script("document.getElementById('input').value = arguments[0];", "hello " * (CTX + 100))
    browser.find_element(By.ID, "send").click()
    try:
        WebDriverWait(browser, WAIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#log .error"))
    except Exception:
        pytest.fail(f"no .error element; stats {_stats(browser)!r}, log {browser.find_element(By.ID, 'log').text!r}")
    err = browser.find_element(By.CSS_SELECTOR, "#log .error").text
    assert str(CTX) in err, f"the error shown is not the server's message: {err!r}"
    assert not browser.find_elements(By.CSS_SELECTOR, "#log .assistant"), "an assistant bubble for a failed request"
    assert len(browser.find_elements(By.CSS_SELECTOR, "#log .user.dropped")) == 1, "the failed turn is not marked"


def test_chat_page_long_prompt_gets_the_rest_of_the_context(server, browser):
    # A conversation that leaves fewer than 256 positions still gets an answer (the page sends no
    # max_tokens of its own: the server gives the rest of the context).
    browser.get(server.url + "/")
    browser.execute_script("document.getElementById('input').value = arguments[0];", "hello " * (CTX - 200))
    browser.find_element(By.ID, "send").click()
    _wait_done(browser, 1)
    assert not browser.find_elements(By.CSS_SELECTOR, "#log .error")


def test_chat_page_asks_for_the_api_key(key_server, browser):
    from selenium.webdriver.support import expected_conditions
    browser.get(key_server.url + "/")
    browser.find_element(By.ID, "input").send_keys("Say hi.")
    browser.find_element(By.ID, "send").click()
    WebDriverWait(browser, WAIT_S).until(expected_conditions.alert_is_present())
    alert = browser.switch_to.alert
    assert "API key" in alert.text, alert.text
    alert.send_keys("sekret")
    alert.accept()
    _wait_done(browser, 1)
    assert not browser.find_elements(By.CSS_SELECTOR, "#log .error")
    assert browser.find_element(By.CSS_SELECTOR, "#log .assistant").text.strip()
