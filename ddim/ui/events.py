"""How the page's events reach the workbench: one device queue slot, raw inputs, errors as messages.

Every event that runs the model shares one queue slot (``concurrency_id="device"``,
limit 1), so requests run one at a time on the device while the server itself keeps
answering (Gradio serves pages and queues from its event loop; handlers run in
worker threads). Those events run with ``preprocess=False``: numbers and files
reach the handlers as the browser sent them, so that the workbench's checks, not
Gradio's generic ones, word the error (Gradio would decode an upload before the
handler runs, and a text file or a damaged image would fail with a bare "Error").
Every error becomes a message in the page (:func:`shown_in_page`) and the server
goes on serving.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Callable

import gradio as gr
import numpy as np
from gradio.utils import get_upload_folder, is_in_or_equal

from ddim.errors import UserError
from ddim.ui.checks import UIError
from ddim.ui.uploads import Upload
from ddim.ui.workbench import Workbench

log = logging.getLogger("ddim.ui")

# Every event that runs the model shares this one queue slot and gets its inputs unprocessed.
ON_DEVICE = {"concurrency_id": "device", "concurrency_limit": 1, "preprocess": False}


def uploaded(payload) -> Upload | None:
    """An upload's file, undecoded, and its name (events run with ``preprocess=False``, see the module's doc).

    Gradio has already checked that the file is one it received (in its upload
    folder, inside the server's temporary directory); this checks it again.
    """
    if payload is None:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("path"), str):
        raise UIError("the upload is not a file")
    path = Path(payload["path"])
    if not is_in_or_equal(path, get_upload_folder()) or not path.is_file():
        raise UIError("an upload must be a file sent to this page")
    return Upload(path.read_bytes(), Path(payload.get("orig_name") or path.name).name)


def editor_image_and_mask(editor: gr.ImageEditor, value, workbench: Workbench) -> tuple[Upload | None, np.ndarray | None]:
    """The editor's background image (as an upload) and the painted region (True where any layer is painted).

    The value arrives unprocessed; the editor's own preprocessing turns it into
    files (it may hold the images the browser sent separately); the background
    file is then read with the workbench's checks, like any upload.
    """
    if value is None:
        return None, None
    try:
        files = editor.preprocess(editor.data_model.model_validate(value))
    except Exception as error:  # noqa: BLE001 - a broken payload is the sender's fault, not a bug
        raise UIError(f"the image editor's content cannot be read ({type(error).__name__}: {error})") from None
    if not files or not files.get("background"):
        return None, None
    background = Path(files["background"])
    image = Upload(background.read_bytes(), "IMAGE")
    painted = None
    for layer in files.get("layers") or []:
        marked = workbench.read_painted(Path(layer).read_bytes())
        painted = marked if painted is None or painted.shape != marked.shape else painted | marked
    return image, painted


def shown_in_page(title: str) -> Callable:
    """Decorate a handler so that every failure is a message in the page, never a dead server.

    A :class:`ddim.errors.UserError` or ``ValueError`` (what the workbench and the
    pipeline raise for bad input) shows its own message; anything else is a bug:
    its traceback goes to the server's log and the page says so.
    """

    def decorate(handler: Callable) -> Callable:
        @functools.wraps(handler)
        def guarded(*args, **kwargs):
            try:
                return handler(*args, **kwargs)
            except gr.Error:
                raise
            except (UserError, ValueError) as error:
                raise gr.Error(str(error), title=title, print_exception=False) from None
            except Exception as error:  # noqa: BLE001 - the server must survive any request
                log.exception("request failed")
                raise gr.Error(
                    f"internal error ({type(error).__name__}: {error}); the server keeps running, "
                    "the traceback is in its log", title=title, print_exception=False,
                ) from None

        return guarded

    return decorate


def progress_status(progress: gr.Progress) -> Callable[[str], None]:
    """A status callback that shows each message on the event's progress bar."""
    return lambda message: progress(0, desc=message)
