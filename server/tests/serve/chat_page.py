"""The chat page at `/` in headless Chromium, through selenium.

Usage: chat_page.py BASE_URL API_KEY SCREENSHOT_PATH

Loads the page without a key, checks that the first API call's 401 makes
it ask for one, enters the key, sends a message, waits for the streamed
answer to finish, and checks the answer, the model line and the speed line.
Exits non-zero with a message on the first check that fails.
"""

import sys

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

base, key, shot = sys.argv[1], sys.argv[2], sys.argv[3]

opts = Options()
opts.binary_location = "/usr/bin/chromium"
for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
            "--disable-gpu", "--window-size=1000,700"):
    opts.add_argument(arg)
opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
try:
    wait = WebDriverWait(driver, 60)
    driver.get(base + "/")
    # The page loaded with no key; the server has one, so it must ask.
    wait.until(ec.visibility_of_element_located((By.ID, "key")))
    driver.find_element(By.ID, "key").send_keys(key)
    driver.find_element(By.CSS_SELECTOR, "#keyform button").click()
    wait.until(lambda d: d.find_element(By.ID, "model").text.startswith("model: "))
    model = driver.find_element(By.ID, "model").text
    placement = driver.find_element(By.ID, "placement").text
    assert "SmolLM2" in model, f"model line: {model!r}"
    assert "layers" in placement, f"placement line: {placement!r}"

    box = driver.find_element(By.ID, "input")
    box.send_keys("Write one sentence about the sea.")
    driver.find_element(By.ID, "go").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".assistant"))
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".assistant")
               .get_attribute("data-state") == "done")
    answer = driver.find_element(By.CSS_SELECTOR, ".assistant")
    text = answer.text.strip()
    assert text, "the streamed answer is empty"
    assert "error" not in answer.get_attribute("class"), f"error shown: {text!r}"
    speed = driver.find_element(By.ID, "speed").text
    assert "tokens/s" in speed, f"speed line: {speed!r}"
    # The key was stored for the next visit.
    stored = driver.execute_script("return localStorage.getItem('lamina.apiKey')")
    assert stored == key, f"stored key: {stored!r}"
    assert not driver.find_element(By.ID, "keyform").is_displayed(), "key form still shown"
    driver.save_screenshot(shot)
    print(f"{model}\nplacement: {placement}\nanswer: {text!r}\n{speed}\nscreenshot: {shot}")
except Exception:
    for entry in driver.get_log("browser"):
        print("console:", entry, file=sys.stderr)
    raise
finally:
    driver.quit()
