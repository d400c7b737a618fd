"""The papers the suite reproduces, one folder each (the registry: importing it registers every
paper's config sections, policies and transmission orders with the paper-neutral core).

A new paper is a folder here with its config section, decisions, measured policy and system model,
one line below, one rules file (experiments/rules/<paper>.smk, which the Snakefile includes for
every name in ``PAPERS``, with a target ``snakemake <paper>``) and one analysis module
(analysis/papers/<paper>.py).
"""

# The core's dispatcher study registers its config section before the papers' do, whichever of the
# two is imported first: the sections' order is the resolved config's, and so its digest.
import moe_core.dispatch_study  # noqa: F401
from moe_core.papers import aurora, axonn, gshard, lina, monta  # noqa: F401  (each registers itself)
from moe_core.schema.sections import register_papers

PAPERS = ("gshard", "lina", "aurora", "monta", "axonn")
register_papers(PAPERS)
# The folders of results/raw/: one per paper, and "common" for the paper-neutral experiments
# (collectives, dispatchers, external validation).
RECORD_FOLDERS = (*PAPERS, "common")
