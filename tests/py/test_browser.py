"""The web page at / in a real browser: headless Debian chromium driven by
python3-selenium with chromium-driver, against `varent serve` on stories260K.

Types a prompt, generates (entropix), waits for streamed tokens, checks the token spans
are coloured by quadrant (the class and the computed background both), hovers one for
its metrics card, checks the chart has one point per token, the entropy/varentropy
lines and the profile's threshold lines (their labels in the margin, right of every
point), runs the stock-vs-entropix side-by-side mode (both charts on one y scale), holds
a two-turn chat (the second request carries the first turn; New chat forgets it), and
saves a screenshot under tests/tmp that is checked to be a non-blank PNG. The page's
temperature is the shared default (0.7) and its requests ask for metrics.
SKIPs when selenium, chromium or chromedriver is absent.
"""
import os
import shutil
import struct
import time
import zlib

import vtest
from vtest import check, skip
from servertest import Server

QUADRANTS = {"LELV", "HELV", "LEHV", "HEHV", "ADAPTIVE", "BRANCH"}


def find_browser():
    try:
        from selenium import webdriver  # noqa: F401
    except ImportError:
        return None, "python3-selenium is not installed"
    chrome = next((p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser", shutil.which("chromium") or "")
                   if p and os.path.exists(p)), None)
    driver = next((p for p in ("/usr/bin/chromedriver", shutil.which("chromedriver") or "") if p and os.path.exists(p)),
                  None)
    if not chrome or not driver:
        return None, "chromium or chromium-driver is not installed"
    return (chrome, driver), ""


def png_pixels(path):
    """(width, height, set of distinct RGB colours sampled) of an 8-bit RGB/RGBA PNG."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    pos, idat = 8, b""
    w = h = ctype = 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            if depth != 8 or ctype not in (2, 6):
                return w, h, None
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, bpp = zlib.decompress(idat), 4 if ctype == 6 else 3
    stride, prev, colours = w * bpp, bytearray(w * bpp), set()
    for y in range(h):  # undo the PNG row filters
        f, row = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = row[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                row[i] = (row[i] + a) & 255
            elif f == 2:
                row[i] = (row[i] + b) & 255
            elif f == 3:
                row[i] = (row[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        if y % 4 == 0:
            for x in range(0, w, 4):
                colours.add(bytes(row[x * bpp:x * bpp + 3]))
        prev = row
    return w, h, colours


def main():
    found, why = find_browser()
    if not found:
        skip("browser", why)
        return
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    chrome, driver_path = found
    model = vtest.stories_dir()
    srv = Server(model, "-t", 1, "--parallel", 2, "--token-delay-ms", 5, name="serve-browser")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900",
              f"--user-data-dir={vtest.tmpdir('chromium')}"):
        opts.add_argument(a)
    try:
        drv = webdriver.Chrome(service=Service(driver_path), options=opts)
    except Exception as e:  # noqa: BLE001 - a browser that cannot start is a skip, not a failure
        srv.kill()
        skip("browser", f"chromium did not start: {str(e).splitlines()[0][:200]}")
        return
    try:
        drv.set_page_load_timeout(30)
        drv.get(f"http://127.0.0.1:{srv.port}/")
        wait = poll
        check(wait(lambda: drv.find_elements(By.CSS_SELECTOR, "#profile option")), "page_loads_profiles",
              "the profile list stayed empty")
        temp = drv.find_element(By.ID, "temperature").get_attribute("value")
        check(temp == "0.7", "page_temperature_is_the_shared_default", temp)
        # every request the page sends, as JSON (the chat turns and the metrics flag are read from them)
        drv.execute_script("window.sent = []; const f = window.fetch; window.fetch = (u, o) => "
                           "{ if (o && o.body) window.sent.push(JSON.parse(o.body)); return f(u, o); };")
        box = drv.find_element(By.ID, "prompt")
        box.clear()
        box.send_keys("Once upon a time, there was a cat")
        drv.find_element(By.ID, "max-tokens").clear()
        drv.find_element(By.ID, "max-tokens").send_keys("60")
        drv.find_element(By.CSS_SELECTOR, "label[for=sampler-entropix]").click()
        drv.find_element(By.ID, "go").click()
        check(wait(lambda: len(drv.find_elements(By.CSS_SELECTOR, ".pane .tok")) >= 3, 20), "tokens_stream_in",
              "no token spans appeared")
        wait(lambda: "done" in drv.find_element(By.ID, "status").text, 30)
        spans = drv.find_elements(By.CSS_SELECTOR, ".pane .tok")
        quads = [s.get_attribute("data-quadrant") for s in spans]
        classes_ok = all(q in QUADRANTS and f"q-{q}" in s.get_attribute("class") for s, q in zip(spans, quads))
        colours = {drv.execute_script("return getComputedStyle(arguments[0]).borderBottomColor", s) for s in spans}
        check(len(spans) >= 10 and classes_ok and len(colours) >= 1 and "rgba(0, 0, 0, 0)" not in colours,
              "token_spans_coloured_by_quadrant", f"{len(spans)} spans, quadrants {set(quads)}, colours {colours}")
        n_metrics = drv.execute_script("return panes[0].metrics.length")
        pts = drv.find_elements(By.CSS_SELECTOR, ".pane svg.chart circle.pt")
        lines = drv.find_elements(By.CSS_SELECTOR, ".pane svg.chart polyline")
        ths = drv.find_elements(By.CSS_SELECTOR, ".pane svg.chart line.threshold")
        check(len(pts) == n_metrics and n_metrics >= 10 and len(lines) == 2 and len(ths) >= 2, "chart_drawn",
              f"{len(pts)} points for {n_metrics} tokens, {len(lines)} lines, {len(ths)} thresholds")
        xs = drv.execute_script("const s = document.querySelector('.pane svg.chart'); return ["
                                "Math.max(...[...s.querySelectorAll('circle.pt')].map((c) => +c.getAttribute('cx') + 3)), "
                                "Math.min(...[...s.querySelectorAll('text.threshold-label')].map((t) => t.getBBox().x))]")
        check(xs[1] > xs[0], "threshold_labels_right_of_the_points", f"points end at x {xs[0]}, labels start at {xs[1]}")
        sent = drv.execute_script("return window.sent")
        check(len(sent) == 1 and sent[0].get("metrics") is True, "page_asks_for_metrics", str(sent)[:200])
        ActionChains(drv).move_to_element(spans[min(4, len(spans) - 1)]).perform()
        card = drv.find_element(By.ID, "card")
        check(wait(lambda: card.is_displayed(), 5) and "entropy" in card.text and "varentropy" in card.text,
              "hover_card_shows_metrics", repr(card.text[:200]))
        shot = os.path.join(vtest.TESTTMP, "browser.png")
        drv.save_screenshot(shot)
        info = png_pixels(shot)
        check(info is not None and info[0] >= 800 and info[2] is not None and len(info[2]) > 20, "screenshot_not_blank",
              f"{shot}: {info and (info[0], info[1], info[2] and len(info[2]))}")
        # stock vs entropix side by side, same seed
        drv.find_element(By.ID, "compare").click()
        drv.find_element(By.ID, "go").click()
        check(wait(lambda: len(drv.find_elements(By.CSS_SELECTOR, ".pane")) == 2 and
                   "done" in drv.find_element(By.ID, "status").text, 30), "compare_two_panes", "no two finished panes")
        samplers = [p.get_attribute("data-sampler") for p in drv.find_elements(By.CSS_SELECTOR, ".pane")]
        stock = drv.find_elements(By.CSS_SELECTOR, ".pane[data-sampler=standard] .tok")
        check(samplers == ["standard", "entropix"] and len(stock) > 0, "compare_stock_and_entropix", str(samplers))
        scales = drv.execute_script("return panes.map((p) => [p.svg.dataset.ymax, "
                                    "Math.max(...p.metrics.map((m) => Math.max(m.entropy, m.varentropy)))])")
        check(len(scales) == 2 and scales[0][0] == scales[1][0] and float(scales[0][0]) >= max(x[1] for x in scales),
              "compare_charts_share_one_y_scale", str(scales))
        drv.save_screenshot(os.path.join(vtest.TESTTMP, "browser-compare.png"))
        test_chat(drv, By)
        logs = [e for e in drv.get_log("browser") if e.get("level") == "SEVERE"] if hasattr(drv, "get_log") else []
        check(not logs, "no_console_errors", str(logs[:2]))
    finally:
        drv.quit()
        srv.stop()
    vtest.done()


def test_chat(drv, By):
    """Two chat turns: the second request holds the first turn (the user's message and the
    reply the page showed); New chat starts over."""
    drv.find_element(By.ID, "compare").click()  # one pane again
    drv.find_element(By.ID, "chat").click()
    drv.find_element(By.ID, "max-tokens").clear()
    drv.find_element(By.ID, "max-tokens").send_keys("12")
    drv.execute_script("window.sent = []")
    for turn, text in ((1, "Tell me about a cat."), (2, "What did the cat do next?")):
        box = drv.find_element(By.ID, "prompt")
        box.clear()
        box.send_keys(text)
        drv.find_element(By.ID, "go").click()
        poll(lambda: f"turn {turn}" in drv.find_element(By.ID, "status").text, 30)
    sent = drv.execute_script("return window.sent")
    reply = drv.execute_script("return panes[0].reply")
    msgs = sent[1].get("messages", []) if len(sent) == 2 else []
    check([m["role"] for m in msgs] == ["user", "assistant", "user"] and msgs[0]["content"] == "Tell me about a cat."
          and msgs[2]["content"] == "What did the cat do next?" and msgs[1]["content"] and
          drv.execute_script("return conversations.entropix[3].content") == reply, "chat_is_multi_turn",
          str(sent)[:400])
    turns = drv.find_elements(By.CSS_SELECTOR, ".pane .turn")
    check(len(turns) == 3, "chat_pane_shows_the_conversation", f"{len(turns)} turns shown")
    drv.find_element(By.ID, "new-chat").click()
    box = drv.find_element(By.ID, "prompt")
    box.send_keys("Hello")
    drv.find_element(By.ID, "go").click()
    poll(lambda: "turn 1" in drv.find_element(By.ID, "status").text, 30)
    sent = drv.execute_script("return window.sent")
    check(len(sent) == 3 and len(sent[2]["messages"]) == 1, "new_chat_forgets_the_conversation", str(sent[-1:])[:300])


def poll(cond, timeout=20):
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            if cond():
                return True
        except Exception:  # noqa: BLE001 - elements can go stale while the page updates
            pass
        time.sleep(0.1)
    return False


if __name__ == "__main__":
    main()
