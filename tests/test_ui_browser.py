"""The web page in a real headless Chromium (Selenium), against ``ddim serve`` on the tiny trained model."""

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def page(ui_server):
    from tests.ui_harness import headless_chromium

    with headless_chromium() as driver:
        driver.get(ui_server.url)
        yield Page(driver)


class Page:
    """What the tests do on the page: fill fields, click, wait for what appears."""

    def __init__(self, driver):
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver = driver
        self.wait = WebDriverWait(driver, 240, poll_frequency=0.05)
        self.wait.until(lambda d: d.find_elements("id", "header"))

    def element(self, element_id):
        return self.driver.find_element("id", element_id)

    def set_number(self, element_id, value):
        from selenium.webdriver.common.keys import Keys

        field = self.element(element_id).find_element("css selector", "input[type=number]")
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(str(value), Keys.TAB)

    def number(self, element_id) -> str:
        return self.element(element_id).find_element("css selector", "input[type=number]").get_attribute("value")

    def gallery_images(self, element_id, count, caption_start):
        """Wait until ``count`` images are loaded in the gallery, the first caption starting with ``caption_start``."""

        def loaded(driver):
            images = self.element(element_id).find_elements("tag name", "img")
            ready = len(images) == count and all(
                driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", image)
                for image in images
            )
            return images if ready and images[0].get_attribute("alt").startswith(caption_start) else False

        return self.wait.until(loaded)

    def saw_text(self, element_id, text) -> bool:
        """Wait until ``text`` shows in the element (e.g. a progress message)."""
        return self.wait.until(lambda d: text in self.element(element_id).text)


def test_sample_shows_images_and_says_when_it_compiles(page):
    page.set_number("sample-images", 3)
    page.set_number("sample-steps", 7)
    page.element("sample-run").click()
    assert page.saw_text("sample-gallery", "compiling for 3 images x 7 steps")
    images = page.gallery_images("sample-gallery", 3, "#0 · seed 0 · 7 steps")
    assert [image.get_attribute("alt") for image in images][2] == "#2 · seed 0 · 7 steps · eta 0"
    assert "ddim sample --checkpoint" in page.element("sample-info").text
    # A random seed, then the images of that seed.
    page.element("sample-random-seed").click()
    page.wait.until(lambda d: page.number("sample-seed") not in ("", "0"))
    seed = page.number("sample-seed")
    page.element("sample-run").click()
    page.gallery_images("sample-gallery", 3, f"#0 · seed {seed} · 7 steps")
    assert "compiling" not in page.element("sample-info").text
