"""One module per paper (Lina's: a package, one module per part of the paper): its reproducers, figures
(in the folder results/figures/<paper>/) and tables, each registered with analysis.registry by
@reproducer, @figure or @table.

Importing this package registers them all; this is the registries' one list of paper modules. A new
paper is one more module here and one more line below.
"""

from analysis.papers import aurora, axonn, common, gshard, lina, monta  # noqa: F401
