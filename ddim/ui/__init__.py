"""``ddim serve``: a local web page to explore a trained model (the ``[ui]`` extra, Gradio).

- :mod:`ddim.ui.workbench`: what the page does, without the web: the loaded
  :class:`~ddim.sampling.Pipeline`, one method per page that validates its input
  and calls the pipeline with one :class:`~ddim.spec.SamplingSpec`. Needs no Gradio.
  Its parts: :mod:`ddim.ui.checks` (numbers, seeds, the server's limits, the
  spec from the page's values), :mod:`ddim.ui.uploads` (decoding uploads and
  painted masks with their limits), :mod:`ddim.ui.device` (one request at a time
  on the device), :mod:`ddim.ui.results` (captions, file names, the summary),
  :mod:`ddim.ui.command` (the ``ddim`` command that reproduces a result) and
  :mod:`ddim.ui.card` (the header: checkpoint, work directory, device).
- :mod:`ddim.ui.page`: the Gradio page over a workbench, a tab per verb (imports Gradio).
  Its parts: :mod:`ddim.ui.controls` (the controls the tabs share),
  :mod:`ddim.ui.events` (the device queue slot, raw inputs, errors shown in the
  page) and :mod:`ddim.ui.downloads` (the result files offered for download).
- :mod:`ddim.ui.server`: starting and stopping the server (temporary files, host,
  port, signals).

Nothing here imports Gradio at module level except the page and its parts, so the
command line stays instant and says how to install the extra when it is missing.
"""

from __future__ import annotations

import importlib.util

INSTALL_HINT = "the web page needs the [ui] extra: pip install 'ddim[ui]' (in a checkout: pip install -e '.[ui]')"


def gradio_available() -> bool:
    """Whether Gradio is installed (without importing it)."""
    return importlib.util.find_spec("gradio") is not None
