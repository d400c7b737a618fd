"""One module per paper: its reproducers (registered with analysis.compare by @reproducer) and its
figures (registered with analysis.figures by @figure, with the folder results/figures/<paper>/).

Importing this package registers them all; this is the registries' one list of paper modules. A new
paper is one more module here and one more line below.
"""

from analysis.papers import aurora, axonn, common, gshard, lina, monta  # noqa: F401
