"""The web page in a real headless Chromium (Selenium), against ``ddim serve`` on the tiny trained model."""

import pytest


@pytest.fixture(scope="module")
def page(ui_server):
    from tests.ui_harness import headless_chromium

    with headless_chromium() as driver:
        driver.get(ui_server.url)
        yield Page(driver)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from tests.test_ui_workbench import gradient, png_bytes

    folder = tmp_path_factory.mktemp("browser-uploads")
    photo = png_bytes(gradient(48, 36))
    (folder / "photo.png").write_bytes(photo)
    (folder / "notes.txt").write_text("not an image\n")
    (folder / "damaged.png").write_bytes(photo[: len(photo) // 2])
    return folder


class Page:
    """What the tests do on the page: open tabs, fill fields, upload, paint, click, wait for what appears."""

    def __init__(self, driver):
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver = driver
        # The page re-renders lists (a dropdown's options) while a condition reads them: look again, not fail.
        self.wait = WebDriverWait(driver, 240, poll_frequency=0.05,
                                  ignored_exceptions=(StaleElementReferenceException,))
        self.wait.until(lambda d: d.find_elements("id", "header"))

    def element(self, element_id):
        return self.driver.find_element("id", element_id)

    def tab(self, name):
        tab = next(t for t in self.driver.find_elements("css selector", "button[role=tab]") if t.text == name)
        tab.click()
        self.wait.until(lambda d: tab.get_attribute("aria-selected") == "true")

    def upload(self, element_id, path):
        self.element(element_id).find_element("css selector", "input[type=file]").send_keys(str(path))

    def paint(self, element_id):
        """Drag the brush across the middle of the editor's canvas."""
        from selenium.webdriver.common.action_chains import ActionChains

        canvas = self.wait.until(lambda d: self.element(element_id).find_elements("tag name", "canvas"))[-1]
        ActionChains(self.driver).move_to_element_with_offset(canvas, -30, -10).click_and_hold() \
            .move_by_offset(30, 10).move_by_offset(30, 10).release().perform()

    def loaded_image(self, element_id):
        """Wait until the output image of ``element_id`` is loaded; returns its <img>.

        An error notice in the page ends the wait at once with its text (not after the timeout).
        """

        def loaded(driver):
            toasts = [t.text for t in driver.find_elements("css selector", "[data-testid=toast-body]")]
            if toasts:
                raise AssertionError(f"the page shows an error instead of {element_id}: {toasts}")
            images = self.element(element_id).find_elements("tag name", "img")
            return images[0] if images and driver.execute_script(
                "return arguments[0].complete && arguments[0].naturalWidth > 0", images[0]) else False

        return self.wait.until(loaded)

    def error_message(self, text) -> str:
        """Wait for an error notice in the page containing ``text``; returns its text."""

        def shown(driver):
            toasts = [t.text for t in driver.find_elements("css selector", "[data-testid=toast-body]")]
            return next((t for t in toasts if text in t), False)

        return self.wait.until(shown)

    def close_messages(self):
        for button in self.driver.find_elements("css selector", "[data-testid=toast-close]"):
            button.click()

    def set_number(self, element_id, value):
        from selenium.webdriver.common.keys import Keys

        field = self.element(element_id).find_element("css selector", "input[type=number]")
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(str(value), Keys.TAB)

    def choose(self, element_id, value):
        """Pick ``value`` in a dropdown menu."""
        from selenium.webdriver.common.keys import Keys

        field = self.element(element_id).find_element("css selector", "input")
        field.click()
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(value, Keys.ENTER)
        self.wait.until(lambda d: field.get_attribute("value") == value)

    def search(self, element_id, typed, expected):
        """Type ``typed`` into a searchable dropdown and take the first match, which must be ``expected``."""
        from selenium.webdriver.common.keys import Keys

        field = self.element(element_id).find_element("css selector", "input")
        field.click()
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(typed)
        options = "[data-testid=dropdown-option]"
        self.wait.until(lambda d: [o.text for o in d.find_elements("css selector", options)] == [expected])
        field.send_keys(Keys.ENTER)
        self.wait.until(lambda d: field.get_attribute("value") == expected)

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


@pytest.mark.slow
def test_sample_shows_images_and_says_when_it_compiles(page):
    page.tab("Sample")
    page.set_number("sample-images", 3)
    page.set_number("sample-steps", 7)
    page.element("sample-run").click()
    assert page.saw_text("sample-gallery", "compiling for 3 images x 7 steps")
    images = page.gallery_images("sample-gallery", 3, "#0 · seed 0 · 7 steps")
    assert [image.get_attribute("alt") for image in images][2] == "#2 · seed 0 · 7 steps · ddim · uniform"
    assert "ddim sample --checkpoint" in page.element("sample-info").text
    # A random seed, then the images of that seed.
    page.element("sample-random-seed").click()
    page.wait.until(lambda d: page.number("sample-seed") not in ("", "0"))
    seed = page.number("sample-seed")
    page.element("sample-run").click()
    page.gallery_images("sample-gallery", 3, f"#0 · seed {seed} · 7 steps · ddim")
    assert "compiling" not in page.element("sample-info").text
    # Another sampler, from its menu.
    page.choose("sample-sampler", "dpmpp-2m")
    page.element("sample-run").click()
    page.gallery_images("sample-gallery", 3, f"#0 · seed {seed} · 7 steps · dpmpp-2m")
    page.choose("sample-sampler", "ddim")


@pytest.mark.slow
def test_an_unconditional_page_has_no_class_picker_and_no_guidance(page):
    for tab in ("sample", "interpolate-start", "interpolate-end", "edit", "inpaint", "trajectory"):
        assert page.driver.find_elements("id", f"{tab}-class") == []
    assert page.driver.find_elements("css selector", "[id$=-guidance]") == []


@pytest.mark.slow
def test_edit_an_uploaded_image(page, files):
    page.tab("Edit")
    page.upload("edit-upload", files / "photo.png")
    page.loaded_image("edit-upload")
    page.set_number("edit-steps", 2)
    page.element("edit-run").click()
    page.loaded_image("edit-output")
    page.loaded_image("edit-input")
    page.wait.until(lambda d: "ddim edit photo.png" in page.element("edit-info").text)


@pytest.mark.slow
def test_inpaint_a_painted_region(page, files):
    page.close_messages()
    page.tab("Inpaint")
    page.upload("inpaint-editor", files / "photo.png")
    page.set_number("inpaint-steps", 2)
    for attempt in range(3):
        # On a loaded machine the editor can take the stroke before it has drawn the upload, and the
        # request then arrives without a painted region: the page says so, and painting again works.
        page.paint("inpaint-editor")
        page.element("inpaint-run").click()
        try:
            page.loaded_image("inpaint-output")
            break
        except AssertionError as error:
            if attempt == 2 or "paint" not in str(error):
                raise
            page.close_messages()
    mask = page.loaded_image("inpaint-mask")
    assert page.driver.execute_script("return arguments[0].naturalWidth", mask) == 48  # the photo's size
    assert "ddim inpaint" in page.element("inpaint-info").text


@pytest.mark.slow
def test_a_text_file_gets_a_message_then_sampling_works_again(page, files):
    page.close_messages()
    page.tab("Reconstruct")
    page.upload("reconstruct-upload", files / "notes.txt")
    page.error_message("notes.txt")  # the page refuses a file that is not an image
    page.upload("reconstruct-upload", files / "damaged.png")  # looks like an image, is not one
    page.set_number("reconstruct-steps", 2)
    page.element("reconstruct-run").click()
    assert "damaged or truncated image" in page.error_message("damaged")
    page.close_messages()
    page.tab("Sample")
    page.set_number("sample-seed", 5)
    page.element("sample-run").click()
    page.gallery_images("sample-gallery", 3, "#0 · seed 5 · 7 steps")


@pytest.fixture(scope="module")
def conditional_page(conditional_ui_server):
    from tests.ui_harness import headless_chromium

    with headless_chromium() as driver:
        driver.get(conditional_ui_server.url)
        yield Page(driver)


def test_a_class_found_by_searching_and_a_guidance_scale(conditional_page):
    page = conditional_page
    page.tab("Sample")
    page.set_number("sample-images", 2)
    page.set_number("sample-steps", 2)
    page.search("sample-class", "prim", "pink primrose")
    page.set_number("sample-guidance", 2.5)
    page.element("sample-run").click()
    images = page.gallery_images("sample-gallery", 2, "#0 · seed 0 · class pink primrose · 2 steps")
    caption = images[1].get_attribute("alt")
    assert caption == "#1 · seed 0 · class pink primrose · 2 steps · ddim · uniform · guidance 2.5"
    command = page.element("sample-info").text
    assert "--class 'pink primrose'" in command and "--guidance 2.5" in command
    # "Any" again: each image's class drawn from the seed, and named under it.
    from ddim.ui.controls import ANY_CLASS_LABEL

    page.search("sample-class", "any", ANY_CLASS_LABEL)
    page.set_number("sample-seed", 4)
    page.element("sample-run").click()
    images = page.gallery_images("sample-gallery", 2, "#0 · seed 4 · class ")
    assert "--class" not in page.element("sample-info").text
